"""The platform job on a real local Ray cluster and a real MLflow store (tiny regions)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ray import cloudpickle

from conftest import local_ray
from optw.distributed import JobProfile, load_profile, plan
from optw.errors import ConfigError
from optw.train.callbacks import Callback, TrainContext

TINY = ["r199", "pr99"]
ROOT = Path(__file__).resolve().parents[1]


def tiny_profile(name: str, mode: str = "scratch", regions=TINY, pack: int = 1,
                 pack_mode: str = "sequential", **train) -> JobProfile:
    """A tiny profile; with ``pack`` > 1 each worker asks for both CPUs of the test cluster,
    so the plan really packs (one worker slot: packs of ``pack``, one Ray Train run a stage;
    with two slots :func:`optw.distributed.plan.packs` would split two regions 1 + 1)."""
    data = {
        "job": {"name": name, "mode": mode, "regions": list(regions)},
        "train": {"epochs": 4, "batch_size": 4, "val_every": 0, "val_tourists": 4,
                  "checkpoint_every": 2, "threads": 1, **train},
        "finetune": {"epochs": 2},
        "evaluate": {"beams": 2, "validation_tourists": 4, "beam_sweep": [1, 2]},
        "resources": {"cpus_per_region": 1 if pack == 1 else 2, "max_failures": 2,
                      "regions_per_worker": pack,
                      "pack_mode": pack_mode},
    }
    return JobProfile.from_dict(data, source=f"test-{name}")


@pytest.fixture(scope="module")
def ray_cluster():
    # The dashboard serves the State API that Ray Train's placement-group cleaner relies on:
    # without it a finished Tune trial can leave its worker's placement group behind; the
    # cleaner finds this cluster's API even beside other Ray instances (RUNTIME_ENV).
    with local_ray(dashboard=True) as ray:
        yield ray


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("mlflow")
    return f"sqlite:///{root / 'mlflow.db'}"


class PauseAfterCheckpoint(Callback):
    """Fault injection: after the first checkpoint, write this worker's pid to a marker file
    and sleep, so a test can SIGKILL the worker at a known point."""

    def __init__(self, marker: str):
        self.marker = Path(marker)

    def on_epoch_end(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        every = ctx.config.checkpoint_every
        if every and ctx.epoch == every and not self.marker.exists():
            self.marker.write_text(str(os.getpid()))
            time.sleep(120)


class FailOnSetting(Callback):
    """Fault injection: at the first epoch's end, note this worker's start in a marker file and
    raise an error meant for the user, as the loop does for a diverged run or a setting."""

    def __init__(self, marker: str):
        self.marker = Path(marker)

    def on_epoch_end(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        with open(self.marker, "a") as f:
            f.write(f"{os.getpid()}\n")
        raise ConfigError("lr = 1e+308: the run diverged at epoch 1 (a test's)", "lr")


# Ray workers cannot import this test module: ship its classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _run(profile, tiny_catalog, store, tmp_path, **kw):
    from optw.distributed.job import run_job

    return run_job(profile, catalog_dir=tiny_catalog.path, tracking_uri=store,
                   storage=tmp_path / "ray_train", out_dir=tmp_path / "out", progress=False,
                   **kw)


# ----------------------------------------------------------------------------- no cluster


def test_shipped_profiles_and_bad_profiles(tmp_path):
    """smoke, quick and paper load into typed configs, each built once ([train], [finetune],
    [finetune.release], [global.<group>]); their config hashes (registries key on them) are
    pinned (smoke and paper as ever; quick's changes with its recipe and fine-tuning); unknown
    keys and bad values are named before anything runs."""
    smoke, paper, quick = load_profile("smoke"), load_profile("paper"), load_profile("quick")
    assert quick.job.mode == "global-ft" and quick.train.recipe == "fast"
    assert quick.job.releases and not smoke.job.releases and not paper.job.releases
    assert quick.train.mix_regions and quick.train.max_minutes
    assert quick.finetune.recipe == "fast" and quick.finetune.finetune
    # [global.<group>] changes [train] for that group's global model only
    assert quick.global_train["solomon"].epochs < quick.train.epochs
    assert set(quick.global_train) == {"solomon", "cordeau"}
    assert not quick.finetune.demos  # imitation is opt-in: it did not win at this scale
    # [finetune.release] changes [finetune] for the fine-tunes from a group's own release
    assert (quick.release_finetune.finetune_lr, quick.finetune.finetune_lr) == (1e-5, 1e-4)
    assert quick.release_finetune.epochs == quick.finetune.epochs
    assert smoke.release_finetune is smoke.finetune
    assert smoke.global_tables == {}  # without [global.*] a profile hashes as before
    assert paper.train.recipe == "paper" and paper.resources.pack_mode == "sequential"
    assert paper.train.epochs == 500_000 and paper.finetune.epochs == 50_000
    assert paper.finetune.learning_rate(10**6) == 1e-5
    assert {n: load_profile(n).config_hash() for n in ("smoke", "quick", "paper")} == {
        "smoke": "8a282eb3902f809e", "quick": "4883581223cb9e99", "paper": "4aef5a32097ad703"}
    assert paper.evaluate.beams == 128 and smoke.job.groups == ["solomon", "cordeau", "gavalas"]
    assert smoke.config_hash() != paper.config_hash()
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nepochz = 3\n")
    with pytest.raises(ConfigError, match="epochz"):
        load_profile(bad)
    bad.write_text("[job]\nmode = 'sideways'\n")
    with pytest.raises(ConfigError, match="sideways"):
        load_profile(bad)
    bad.write_text("[evaluate]\nbeams = 500\n")
    with pytest.raises(ConfigError, match="beams"):
        load_profile(bad)
    bad.write_text("[finetune]\nlr = -1\n")
    with pytest.raises(ConfigError, match="lr"):
        load_profile(bad)
    bad.write_text("[global.cordeau]\nepochs = -3\n")
    with pytest.raises(ConfigError, match=r"\[global\.cordeau\].*epochs"):
        load_profile(bad)
    bad.write_text("[resources]\npack_mode = 'diagonal'\n")
    with pytest.raises(ConfigError, match="pack_mode.*batched"):
        load_profile(bad)
    with pytest.raises(ConfigError, match="neither"):
        load_profile("no-such-profile")


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v != v:
        return "nan"
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(map(_toml_value, v)) + "]"
    return repr(v)


#: (table, key, bad values): a generated family per kind of field
BAD_PROFILE_VALUES = [
    *[("train", k, [0, -1, 1.5, "x", True]) for k in
      ("epochs", "batch_size", "tourists_per_epoch", "lr_decay_every")],
    *[("train", k, [-1, 2.5, "x", False]) for k in
      ("val_every", "checkpoint_every", "val_tourists")],
    *[("train", k, [0.0, -1e-3, float("nan"), float("inf"), "x", True]) for k in
      ("lr", "lr_min", "finetune_lr", "max_grad_norm")],
    ("train", "lr_decay", [0.0, 1.5, float("nan")]),
    ("train", "beta", [-0.1, float("inf"), float("nan")]),
    ("train", "device", ["gpu", "cuda:x", 3]),
    ("train", "threads", [0, -2, 1.5]),
    ("train", "score_kind", ["gaussian"]),
    ("train", "seed", [1.5, "x"]),
    ("train", "unknown_key", [1]),
    *[("finetune", k, [0, -1, "x"]) for k in ("epochs", "batch_size")],
    ("finetune", "finetune_lr", [0.0, float("nan"), float("inf")]),
    ("finetune", "unknown_key", [1]),
    ("evaluate", "beams", [0, 129, 1.5, "x", True]),
    ("evaluate", "beam_sweep", [[0], [1, 500], ["x"], 4]),
    ("evaluate", "active_search", [-1, 1.5]),
    ("evaluate", "validation_tourists", [-1, 65, 2.5]),
    ("evaluate", "keep_greedy", ["yes", 1]),
    ("evaluate", "one_by_one", ["yes", 0]),
    ("evaluate", "unknown_key", [1]),
    ("resources", "cpus_per_region", [0, -1, float("nan"), float("inf"), "x"]),
    ("resources", "gpu_fraction", [0, 1.5, float("nan")]),
    ("resources", "cpus_per_region", [2000]),
    ("resources", "regions_per_worker", [0, 10**6, 1.5]),
    ("resources", "max_failures", [-1, -2, 1.5, 101]),  # -1 would retry for ever
    ("resources", "unknown_key", [1]),
    ("job", "mode", ["sideways", 3]),
    ("job", "groups", [[], ["nope"], "solomon", [3], ["solomon", "solomon"]]),
    ("job", "regions", ["c101", [3], [""], ["c101", "c101"]]),
    ("job", "name", ["", "two words", "a/b", 3, "x" * 101]),
    ("job", "unknown_key", [1]),
]


def test_bad_profile_values_name_file_table_and_key(tmp_path):
    """Every generated bad value in every table of a profile file fails at load time with a
    ConfigError naming the file, the table and the key (model keys included)."""
    problems = []
    for table, key, values in BAD_PROFILE_VALUES:
        for value in values:
            path = tmp_path / f"{table}-{key}.toml"
            path.write_text(f"[{table}]\n{key} = {_toml_value(value)}\n")
            try:
                load_profile(path)
                problems.append(f"[{table}] {key} = {value!r} accepted")
            except ConfigError as exc:
                msg = str(exc)
                if not (str(path) in msg and f"[{table}]" in msg and key in msg):
                    problems.append(f"[{table}] {key} = {value!r}: {msg}")
    path = tmp_path / "model.toml"
    for line in ("clipp = 3", "clip = nan", "n_layers = 0", "graph = 'ring'", "d_model = 1.5"):
        path.write_text(f"[train.model]\n{line}\n")
        with pytest.raises(ConfigError, match=rf"{path}.*\[train\].*model"):
            load_profile(path)
    assert problems == []


def test_a_profiles_tables_and_groups_are_checked_when_it_loads(tmp_path):
    """A profile's structure is checked when it loads, naming the file and the table: an
    unknown table, a [global.<group>] table of no group a job can train (a typo such as
    [global.solomn] passed silently), a table that is not one, regions outside [job], a bad
    [finetune.release]."""
    path = tmp_path / "p.toml"
    for text, words in (
            ("[trian]\nepochs = 3\n", ["unknown table", "trian"]),
            ("[global.solomn]\nepochs = 3\n", ["[global.solomn]", "unknown group 'solomn'"]),
            ("[global.nope]\nepochs = 3\n", ["[global.nope]", "unknown group 'nope'"]),
            ("[global]\nepochs = 3\n", ["[global]", "epochs"]),
            ("train = 3\n", ["train = 3", "[train]"]),
            ("[train]\nregions = ['c101']\n", ["[train]", "regions", "[job] regions"]),
            ("[finetune]\nregions = ['c101']\n", ["[finetune]", "regions"]),
            ("[finetune]\nrelease = 3\n", ["[finetune]", "release = 3", "[finetune.release]"]),
            ("[finetune.release]\nregions = ['c101']\n", ["[finetune.release]", "regions"]),
            ("[finetune.release]\nfinetune_lr = 2\n", ["[finetune.release]", "finetune_lr"])):
        path.write_text(text)
        with pytest.raises(ConfigError) as err:
            load_profile(path)
        msg = str(err.value)
        assert str(path) in msg and all(w in msg for w in words), msg
    path.write_text("[job]\ngroups = ['custom']\n[global.custom]\nepochs = 3\n")
    assert load_profile(path).global_train["custom"].epochs == 3


def test_batch_size_walks_from_a_profile_to_the_worker(tiny_catalog, tmp_path):
    """docs/architecture.md's first walk, through the functions it names, without Ray: a
    profile file's [train] batch_size (with `optw job run --regions`) reaches the Ray Train
    worker's TrainConfig unchanged: load_profile (in profile_from_args) → config_for →
    WorkerSpec.build → the worker function make_trainer binds (train_worker and the typed
    pack), the very object the plan resolved."""
    import argparse
    import functools

    from optw.distributed.cli import profile_from_args
    from optw.distributed.plan import Member, select_regions
    from optw.distributed.ray_train import WorkerPack, WorkerSpec, make_trainer, train_worker

    path = tmp_path / "walk.toml"
    path.write_text("[job]\nname = 'walk'\n[train]\nbatch_size = 7\ntourists_per_epoch = 3\n"
                    "epochs = 2\n")
    args = argparse.Namespace(profile=str(path), groups=None, regions="r199,pr99",
                              from_groups=None, mode=None, name=None)
    profile = profile_from_args(args, tiny_catalog)
    regions = select_regions(tiny_catalog, profile.job.groups, profile.job.regions)
    (stage,) = plan(profile.job.mode, tiny_catalog, regions)
    members = [Member(u, profile.config_for(u)) for u in stage]
    assert [(m.config.batch_size, m.config.regions) for m in members] == [
        (7, ["r199"]), (7, ["pr99"])]
    spec = WorkerSpec.build(members[0].config, "r199", "scratch",
                            catalog=str(tiny_catalog.path), tracking_uri="sqlite:///unused.db",
                            run_id=None)
    trainer = make_trainer(WorkerPack((spec,)), str(tmp_path / "ray_train"), "walk",
                           profile.resources, use_gpu=False)
    bound = trainer.train_loop_per_worker
    assert isinstance(bound, functools.partial) and bound.func is train_worker
    (worker_spec,) = bound.args[0].specs
    assert worker_spec.config is members[0].config
    assert (worker_spec.config.batch_size, worker_spec.config.tourists_per_epoch) == (7, 3)


def test_an_epoch_that_cannot_fit_is_refused_before_anything_starts(tiny_catalog, tmp_path):
    """A job whose settings cannot fit in memory (batch_size × tourists_per_epoch routes of a
    model's largest region: here about 1.7 TB) is refused before Ray, an MLflow store or any
    output exists, naming the profile's table of that model ([train], or [finetune] for the
    fine-tuned ones) and both settings."""
    import dataclasses

    from optw.distributed.job import run_job

    big = {"batch_size": 1024, "tourists_per_epoch": 1024}
    scratch = tiny_profile("fits", **big)
    finetune = dataclasses.replace(tiny_profile("fits-ft", mode="global-ft"),
                                   finetune_table=big)
    for profile, table in ((scratch, "test-fits [train]"), (finetune, "test-fits-ft [finetune]")):
        with pytest.raises(ConfigError, match=rf"{re.escape(table)}: batch_size = 1024 × "
                           "tourists_per_epoch = 1024"):
            run_job(profile, catalog_dir=tiny_catalog.path,
                    tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                    storage=tmp_path / "ray_train", out_dir=tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_tune_space_is_checked_before_any_trial(tiny_catalog, tmp_path):
    """A search space that can draw an invalid config (a bad choice, a range end, an unknown
    key) fails in run_sweep before Ray or MLflow are touched, naming the key and value."""
    import ray

    from optw.distributed.tune import apply_trial, check_space, run_sweep

    base = tiny_profile("space").train.replace(regions=["r199"], val_every=2)
    assert apply_trial(base, {"lr": 1e-3, "model.clip": 5.0}).model["clip"] == 5.0
    for space, word in (({"batch_size": ("choice", [16, 0])}, "batch_size = 0"),
                        ({"lr": ("uniform", -1.0, 1e-3)}, "lr = -1.0"),
                        ({"model.n_layers": ("choice", [1, 0])}, "model.n_layers = 0"),
                        ({"model.nope": ("choice", [1])}, "nope"),
                        ({"epochz": ("choice", [1])}, "epochz"),
                        ({"beta": ("choice", [])}, "non-empty"),
                        ({"lr": ("loguniform", 1e-3, 1e-5)}, "low < high"),
                        ({"lr": ("loguniform", 0.0, 1e-3)}, "low > 0"),
                        ({"beta": ("uniform", 0.0, float("nan"))}, "finite"),
                        ({"lr": ("uniform", 1e-3)}, r"expected \(kind"),
                        ({"lr": ("normal", 1e-4, 1e-3)}, "kind"),
                        # an epoch that cannot fit in memory (1M routes of r199's nodes)
                        ({"batch_size": ("choice", [1 << 20])}, "batch_size = 1048576")):
        with pytest.raises(ConfigError, match=word):
            check_space(base, space, n_nodes=12)  # r199's
        with pytest.raises(ConfigError, match=word):
            run_sweep(tiny_profile("space", val_every=2), ["r199"], num_samples=1, space=space,
                      catalog_dir=tiny_catalog.path, tracking_uri="http://127.0.0.1:9",
                      storage=tmp_path / "tune", progress=False)
    from optw.errors import UserError

    with pytest.raises(UserError, match=r"--samples: 100000000 trials; give an integer in "
                       r"1\.\.10,000"):
        run_sweep(tiny_profile("space", val_every=2), ["r199"], num_samples=10**8,
                  catalog_dir=tiny_catalog.path, tracking_uri="http://127.0.0.1:9",
                  storage=tmp_path / "tune", progress=False)
    assert not ray.is_initialized() and not (tmp_path / "tune").exists()


def test_region_workers_ask_for_their_gpu_share():
    """With GPUs in the cluster each region's Ray Train worker asks for its CPUs and
    ``[resources] gpu_fraction`` of a GPU (and for no GPU otherwise)."""
    from optw.distributed.profile import ResourcesSection
    from optw.distributed.ray_train import WorkerSpec, make_trainer
    from optw.train import TrainConfig

    spec = WorkerSpec(TrainConfig(regions=["r199"]), "r199", "scratch", "cat", "sqlite:///x",
                      None)
    res = ResourcesSection(cpus_per_region=0.5, gpu_fraction=0.25)
    gpu = make_trainer(spec, "/tmp/x", "n", res, use_gpu=True).scaling_config
    cpu = make_trainer(spec, "/tmp/x", "n", res, use_gpu=False).scaling_config
    assert gpu.use_gpu and gpu.resources_per_worker == {"CPU": 0.5, "GPU": 0.25}
    assert not cpu.use_gpu and cpu.resources_per_worker == {"CPU": 0.5}


def test_packs_keep_every_worker_slot_busy():
    """A stage's units go into packs of at most regions_per_worker, smaller when there are
    fewer units than that per worker slot (3 global models on 2 slots: 2 + 1)."""
    from optw.distributed.plan import Member, Unit, packs
    from optw.train import TrainConfig

    def members(n: int) -> list[Member]:
        return [Member(Unit("scratch", f"r{i}", [f"r{i}"]), TrainConfig(regions=[f"r{i}"]))
                for i in range(n)]

    assert [len(p) for p in packs(members(3), 14, capacity=2)] == [2, 1]
    assert [len(p) for p in packs(members(109), 14, capacity=4)] == [14] * 7 + [11]
    assert [len(p) for p in packs(members(5), 1, capacity=8)] == [1] * 5


def test_worker_slots_count_what_each_worker_asks_node_by_node():
    """The job's worker slots (the capacity its packs are planned for) count, on each node,
    how many workers fit every resource they ask for: CPUs, a GPU share and custom resources
    (a job's ``worker_resources``), never a CPU of one node plus one of another."""
    from optw.distributed.preflight import worker_slots

    head, node = {"Resources": {"CPU": 3.0}}, {"Resources": {"CPU": 3.0, "GPU": 1.0, "t": 2.0}}
    assert worker_slots({"CPU": 2}, [head, node]) == 2  # not 6 // 2
    assert worker_slots({"CPU": 1}, [head, node]) == 6
    assert worker_slots({"CPU": 1, "t": 1}, [head, node]) == 2  # only the node has "t"
    assert worker_slots({"CPU": 1, "GPU": 0.25}, [head, node]) == 3
    assert worker_slots({"CPU": 1, "GPU": 1 / 3}, [head, node]) == 3  # fractions round well
    assert worker_slots({"CPU": 8}, [head, node]) == 1  # none yet: a launcher may add nodes


def test_plan_resolves_configs_and_pack_mode_once(catalog):
    """The plan resolves each unit's TrainConfig once (config_for: [train], [finetune] or
    [global.<group>]) and decides per pack whether it trains batched: per-region models of one
    shape batch, a pack of global models, of mixed model shapes or with a rollout packs do not
    take (rollout = "graph") is planned sequential, and
    the sequential profile never batches. The specs are frozen."""
    import dataclasses

    from optw.distributed.plan import Member, PackSpec, packs

    profile = tiny_profile("plan", mode="global-ft", pack=4, pack_mode="batched")
    g, f = plan("global-ft", catalog, ["c101", "c102", "pr01"])
    first = [Member(u, profile.config_for(u)) for u in g]
    second = [Member(u, profile.config_for(u)) for u in f]
    assert [m.config.regions for m in second] == [["c101"], ["c102"], ["pr01"]]
    assert all(m.config.finetune for m in second)
    assert first[0].config.regions == g[0].train_regions and not first[0].config.finetune
    assert [p.batched for p in packs(second, 4, 1, "batched")] == [True]
    assert [p.batched for p in packs(second, 4, 1, "sequential")] == [False]
    assert [p.batched for p in packs(first, 4, 1, "batched")] == [False]  # global models
    wide = Member(second[0].unit, second[0].config.replace(model={"d_model": 64}))
    assert [p.batched for p in packs([wide, *second[1:]], 4, 1, "batched")] == [False]
    graph = Member(second[0].unit, second[0].config.replace(rollout="graph"))
    assert [p.batched for p in packs([graph, *second[1:]], 4, 1, "batched")] == [False]
    pack = packs(second, 4, 1, "batched")[0]
    assert isinstance(pack, PackSpec) and pack.keys == ["c101", "c102", "pr01"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        pack.batched = False  # type: ignore[misc]


def test_only_a_fine_tune_from_its_own_groups_release_takes_finetune_release(catalog):
    """[finetune.release] is for the regions fine-tuned from their own group's release
    (global-ft): a transfer-to from a release, or a fine-tune from a global model the job
    trains, keeps [finetune]; the report names the table each model's settings come from."""
    import dataclasses

    profile = tiny_profile("release-lr", mode="global-ft")
    profile = dataclasses.replace(profile, finetune_table={
        "epochs": 2, "finetune_lr": 1e-4, "release": {"finetune_lr": 1e-5}})
    own = plan("global-ft", catalog, ["c101", "pr01"], releases=["solomon"])[-1]
    lr = {u.key: profile.config_for(u).finetune_lr for u in own}
    assert lr == {"c101": 1e-5, "pr01": 1e-4}  # pr01: from the job's global-cordeau
    assert profile.table_of(own[0]) == "test-release-lr [finetune.release]"
    other = plan("transfer-to", catalog, ["pr01"], ["gavalas"], releases=["gavalas"])[-1]
    assert other[0].init_from == "release:gavalas"
    assert profile.config_for(other[0]).finetune_lr == 1e-4


def test_comma_lists_refuse_empty_and_repeated_entries():
    """`--regions c101,,c102` and `c101,c101` are refused naming the option and the entry
    (they were silently dropped); spaces around names stay allowed."""
    from optw.distributed.cli import comma_list

    assert comma_list(" c101, c102 ", "--regions") == ["c101", "c102"]
    with pytest.raises(ValueError, match=r"--regions: 'c101,,c102' has an empty entry \(entry 2"):
        comma_list("c101,,c102", "--regions")
    with pytest.raises(ValueError, match="--groups: 'a,b,a' names 'a' twice"):
        comma_list("a,b,a", "--groups")


def test_tune_refuses_a_grace_period_past_the_budget(tiny_catalog, tmp_path):
    """`optw tune --val-every 100 --epochs 10` (ASHA's grace period past max_t) is refused
    before Ray starts or anything is written, naming both options."""
    import ray

    from optw.distributed.tune import run_sweep

    with pytest.raises(ValueError, match="--val-every 100 is more than --epochs 10"):
        run_sweep(tiny_profile("grace", epochs=10, val_every=100), ["r199"], num_samples=1,
                  catalog_dir=tiny_catalog.path, tracking_uri=f"sqlite:///{tmp_path}/m.db",
                  storage=tmp_path / "tune", progress=False)
    assert not ray.is_initialized() and not (tmp_path / "tune").exists()


def _job_cli(tiny_catalog, tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess, float]:
    """`jobs/train_all.py` on the tiny catalog in a fresh process (no RAY_ADDRESS)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "train_all.py"), "--profile", "smoke",
         "--regions", "r199", "--catalog", str(tiny_catalog.path), "--out", str(tmp_path / "out"),
         "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", *extra],
        env=env, capture_output=True, text=True, timeout=300)
    return proc, time.perf_counter() - t0


def test_a_dead_ray_address_fails_fast_and_creates_nothing(tiny_catalog, tmp_path):
    """`--address 127.0.0.1:1` (nothing listens there) is one line naming --address within
    seconds (Ray itself retried every 30 s for minutes), and nothing is created: no output or
    Ray Train folder, no MLflow store."""
    proc, seconds = _job_cli(tiny_catalog, tmp_path, "--address", "127.0.0.1:1")
    err = proc.stderr.strip()
    assert proc.returncode == 2 and err.startswith("optw job run: error: --address 127.0.0.1:1")
    assert "\n" not in err and "Traceback" not in err
    assert seconds < 60, seconds  # the process's own start (torch, ray) is most of it
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_plan_per_mode(catalog):
    """scratch: one model per region; global-ft: a global model per group then fine-tunes;
    transfer: global models without the subset of 28, fine-tuned on the left-out regions."""
    sel = ["c101", "r101", "pr01", "t101"]
    (s,) = plan("scratch", catalog, sel)
    assert [u.key for u in s] == sel and all(u.register for u in s)
    g, f = plan("global-ft", catalog, sel)
    assert {u.key for u in g} == {"global-solomon", "global-cordeau", "global-gavalas"}
    assert all(u.key == f"global-{u.group}" for u in g)  # whose [global.<group>] applies
    assert all(u.init_from == f"global-{catalog.regions_table.at[u.key, 'group']}" for u in f)
    assert all(u.method == "global_ft" and u.register for u in f)
    assert all(not u.register and not u.eval_regions for u in g)
    tg, tf = plan("transfer", catalog, ["c101", "c103", "pr01"])
    sol = next(u for u in tg if u.key == "transfer-solomon")
    assert "c101" not in sol.train_regions and "c103" in sol.train_regions
    assert sol.eval_regions == ["c101"] and sol.method == "tl"
    assert [u.key for u in tf] == ["c101", "pr01"] and tf[0].method == "ft_tl"


def test_bad_input_fails_before_training(tiny_catalog, tmp_path):
    """Unknown regions and an unreachable tracking store fail at once, with a clear error."""
    with pytest.raises(KeyError, match="zz9"):
        _run(tiny_profile("bad", regions=["zz9"]), tiny_catalog, "sqlite:///x.db", tmp_path)
    from optw.tracking import TrackingUnavailableError

    with pytest.raises(TrackingUnavailableError):
        _run(tiny_profile("bad"), tiny_catalog, "http://127.0.0.1:9", tmp_path)
    assert not (tmp_path / "ray_train").exists()


# ----------------------------------------------------------------------------- real cluster


def test_a_job_beside_another_local_ray_names_the_address(ray_cluster, tiny_catalog, tmp_path):
    """A job started without --address while another local Ray instance runs (this module's)
    would start a second one beside it and hang ("Found multiple active Ray instances"): it is
    refused in one line naming --address and the running instance's address."""
    address = ray_cluster.get_runtime_context().gcs_address
    proc, _ = _job_cli(tiny_catalog, tmp_path)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and err.startswith("optw job run: error: --address"), err
    assert address in err and "--address local" in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_a_worker_no_node_can_hold_is_refused_before_training(ray_cluster, tiny_catalog,
                                                               store, tmp_path):
    """A profile whose region worker asks for more CPUs than any node has made Ray wait for
    ever ("No available node types can fulfill resource request"): it is refused before
    anything is created, naming resources.cpus_per_region and the largest node."""
    import dataclasses

    from optw.distributed.preflight import check_worker_fits

    profile = tiny_profile("too-big")
    profile = dataclasses.replace(profile, resources=dataclasses.replace(
        profile.resources, cpus_per_region=64))
    with pytest.raises(ConfigError, match=r"test-too-big \[resources\]: resources\."
                       r"cpus_per_region = 64: .* largest .* has 2 CPUs"):
        _run(profile, tiny_catalog, store, tmp_path)
    assert not (tmp_path / "out").exists() and not (tmp_path / "ray_train").exists()
    nodes = [{"Resources": {"CPU": 2.0}}, {"Resources": {"CPU": 8.0, "GPU": 1.0}}]
    check_worker_fits(4, 0.25, nodes, 0)  # the second node holds it
    check_worker_fits(4, None, nodes[:1], can_add=3)  # a launcher may add one
    with pytest.raises(ValueError, match="largest node of this cluster has 3 CPUs"):
        check_worker_fits(4, None, [nodes[0], {"Resources": {"CPU": 3.0}}], 0)
    with pytest.raises(ValueError, match="4 CPUs and a GPU share"):  # CPUs here, GPU there
        check_worker_fits(4, 0.25, [{"Resources": {"CPU": 8.0}},
                                    {"Resources": {"CPU": 2.0, "GPU": 1.0}}], 0)


def test_a_worker_failing_on_a_setting_fails_once_in_one_line(ray_cluster, tiny_catalog, store,
                                                               tmp_path):
    """A worker that stops on a setting (an OptwError in the worker: a diverged run, a value
    out of range, memory) is not restarted, though [resources] max_failures = 2 (a restart
    would fail the same way): the job fails once, its error one line naming the pack and the
    setting, no traceback; the worker ran once."""
    from optw.distributed.job import PacksFailedError

    marker = tmp_path / "starts.txt"
    with pytest.raises(PacksFailedError) as err:
        _run(tiny_profile("setting", regions=["r199"]), tiny_catalog, store, tmp_path,
             force=True, callbacks={"r199": [FailOnSetting(str(marker))]})
    assert str(err.value) == ("1 pack(s) failed:\n  scratch r199: lr = 1e+308: the run "
                              "diverged at epoch 1 (a test's)")
    assert len(marker.read_text().splitlines()) == 1


@pytest.mark.parametrize("pack,pack_mode", [
    # `make test-slow`: the default suite checks the one-region worker's restart and the
    # one-after-another pack's in test_two_node's killed remote worker (a pack of both regions
    # trained one after another, killed during its second one)
    pytest.param(1, "sequential", marks=pytest.mark.slow),
    pytest.param(2, "sequential", marks=pytest.mark.slow),
    (2, "batched")])
def test_killed_worker_resumes_from_checkpoint(ray_cluster, tiny_catalog, store, tmp_path,
                                               pack, pack_mode):
    """SIGKILL of one region's Ray Train worker after its first checkpoint: Ray Train restarts
    it from that checkpoint, the job completes every region, one registry version each. With
    a pack of both regions in one worker trained one after another (pr99 second), the
    restarted worker keeps r199's finished model instead of training it again; trained side
    by side, both members resume from the pack's one checkpoint. (``pack=1`` and the
    one-after-another pack are marked slow: test_two_node.py::
    test_two_node_job_with_killed_remote_worker kills a one-after-another pack of both regions
    during its second region in the default suite.)"""
    from optw.tracking import get_client

    marker = tmp_path / "paused.pid"
    killed = {}

    def killer():
        deadline = time.time() + 150
        while time.time() < deadline and not marker.exists():
            time.sleep(0.2)
        if marker.exists():
            time.sleep(0.5)
            pid = int(marker.read_text())
            os.kill(pid, signal.SIGKILL)
            killed["pid"] = pid

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    job = f"kill-{pack}-{pack_mode}"
    profile = tiny_profile(job, epochs=6, checkpoint_every=2, pack=pack, pack_mode=pack_mode)
    summary = _run(profile, tiny_catalog, store, tmp_path, force=True,  # same config each
                   callbacks={"pr99": [PauseAfterCheckpoint(str(marker))]})
    t.join(5)
    assert killed, "the worker never reached its first checkpoint"
    assert sorted(summary.registered) == sorted(TINY)
    client = get_client(store)
    for rid in TINY:
        versions = client.search_model_versions(f"name = 'optw-{rid}'")
        job_versions = [v for v in versions if v.tags.get("job") == job]
        assert len(job_versions) == 1
        steps = [m.step for m in client.get_metric_history(job_versions[0].run_id,
                                                           "mean_reward")]
        if rid == "r199":  # trained once: its log points are not repeated by the restart
            assert sorted(steps) == sorted(set(steps)), steps
    import torch

    for rid in TINY:
        ckpt = torch.load(Path(tmp_path / "out" / "models" / f"scratch-{rid}.pt"),
                          weights_only=True)
        assert ckpt["train"]["epoch"] == 6


@pytest.mark.slow
def test_tune_sweep_few_trials(ray_cluster, tiny_catalog, store, tmp_path):
    """A Tune sweep of a few trials on a local Ray reports gap to ILS and picks the best.
    (`make test-slow`: the default suite runs a sweep on the two-node cluster,
    test_two_node.py::test_tune_runs_against_the_jobs_storage_uri, picks the best of a trials
    table in test_tune_picks_the_trial_closest_to_ils and writes a profile from it in
    test_tune_writes_the_best_trial_as_a_profile.)"""
    from optw.distributed.tune import run_sweep

    profile = tiny_profile("sweep", epochs=4, val_every=2)
    res = run_sweep(profile, ["r199"], num_samples=2,
                    space={"lr": ("choice", [1e-4, 1e-3]), "model.clip": ("choice", [5.0, 10.0])},
                    catalog_dir=tiny_catalog.path, tracking_uri=store,
                    storage=tmp_path / "tune", progress=False)
    assert len(res.trials) == 2 and res.best_config["lr"] in (1e-4, 1e-3)
    assert set(res.best_trial) == {"lr", "model.clip"}


def test_tune_picks_the_trial_closest_to_ils():
    """The sweep's best trial is the one with the smallest gap to ILS among the trials that
    reported one (a failed trial has none), its drawn values as plain Python numbers; a
    sweep where no trial reported fails naming the trials' errors."""
    import math

    import pandas as pd

    from optw.distributed.tune import METRIC, pick_best

    trials = pd.DataFrame({"trial.lr": [1e-4, 1e-3, 3e-4], "trial.model.clip": [5.0, 10.0, 5.0],
                           METRIC: [12.5, 3.0, math.nan], "error": ["", "", "boom"]})
    best, drawn = pick_best(trials)
    assert best[METRIC] == 3.0 and drawn == {"lr": 1e-3, "model.clip": 10.0}
    assert all(type(v) is float for v in drawn.values())
    with pytest.raises(RuntimeError, match="boom"):
        pick_best(trials.iloc[2:])


def test_tune_writes_the_best_trial_as_a_profile(tmp_path):
    """A sweep's best trial (its sampled settings, dotted keys as in the search space) becomes
    a profile that keeps the base profile's budget, takes the file's name as the job's, and is
    never written over an existing file."""
    from optw.distributed.tune import write_profile

    best_trial = {"lr": 1e-3, "model.clip": 5.0}
    base = tiny_profile("sweep", epochs=40, val_every=10)  # the budget a written profile keeps
    out = write_profile(base, best_trial, tmp_path / "best.toml")
    best = load_profile(out)
    assert best.train.lr == 1e-3 and best.train.model.get("clip") == 5.0
    assert best.job.name == "best" and best.train.epochs == 40 and best.train.val_every == 10
    with pytest.raises(FileExistsError):
        write_profile(base, best_trial, out)  # never overwritten


@pytest.mark.slow
def test_report_of_a_real_tiny_job(ray_cluster, tiny_catalog, tmp_path):
    """The report of a real tiny platform job (Ray, two regions) has training curves, gap
    and time/score plots, and is logged as `report/` of the parent run. (Here, with the
    other tests that start Ray; the report's own tests are in test_report.py.)"""
    from optw.report import write_and_log_report
    from optw.tracking import get_client

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    summary = _run(tiny_profile("report-e2e", val_every=2), tiny_catalog, uri, tmp_path)
    index = write_and_log_report(summary.parent_run_id, tmp_path / "out" / "report", uri)
    plots = sorted(p.name for p in (index.parent / "plots").iterdir())
    assert "time_score.png" in plots and "gaps_benchmark.png" in plots
    assert any(p.startswith("curves_") for p in plots)
    names = {f.path for f in get_client(uri).list_artifacts(summary.parent_run_id, "report")}
    assert "report/index.html" in names


# ----------------------------------------------------------------------------- real regions

REAL = ["pr01", "pr02"]


@pytest.fixture(scope="module")
def real_catalog(catalog, tmp_path_factory):
    """A private copy of the benchmark catalog (the job stores ILS results into it)."""
    from conftest import copy_catalog
    from optw.catalog import Catalog

    return Catalog(copy_catalog(catalog, tmp_path_factory.mktemp("real") / "catalog"))


def _check_real_job(summary, store, tmp_path, method: str):
    """Registered versions of both regions load as files, as MLflow models (by version and
    by the champion alias) and solve; results carry ``method``."""
    import pandas as pd

    from optw.model import load_model
    from optw.tracking import load_solver

    assert sorted(summary.registered) == sorted(REAL)
    df = pd.read_parquet(summary.results_path)
    assert {method, f"{method}_greedy"} <= set(df["method"])
    for rid in REAL:
        stage = "scratch" if method == "model" else "finetune"
        load_model(tmp_path / "out" / "models" / f"{stage}-{rid}.pt")
        for ref in (f"models:/optw-{rid}/{summary.registered[rid]}",
                    f"models:/optw-{rid}@champion"):
            solver = load_solver(ref, uri=store)
            n = solver.region.n_points
            sol = solver.solve([{"start": [0, 0], "t_start": 0, "t_end": 1000,
                                 "scores": [1] * n}], method="greedy")
            assert len(sol) == 1
    return df


@pytest.mark.parametrize("mode,method", [
    # `make test-slow`. The default suite checks scratch end to end through test_embedded.py's
    # job and test_distributed's killed-worker job; a job's global stage and fine-tuning stage
    # (champions, results, summary table and report logged, a re-run that changes nothing)
    # through test_custom_job.py's transfer-to job; a global model validated on several regions
    # in test_pack.py, its gap to ILS in test_evaluate.py; global-ft's plan in test_plan_per_mode
    pytest.param("scratch", "model", marks=pytest.mark.slow),
    pytest.param("global-ft", "global_ft", marks=pytest.mark.slow)])
def test_job_modes_on_real_regions(ray_cluster, real_catalog, tmp_path, mode, method):
    """scratch and global-ft on two real Cordeau regions with stored ILS results (validation
    over several regions, gaps to ILS): both complete and register loadable champions (both
    slow: see the parameters for where the default suite checks the same). scratch: each
    region's champion is the version the job registered, the results,
    summary table and report are written and logged; running the job again skips every
    region, registers nothing new and keeps the earlier report, results and parent run.
    global-ft: one global model of the group (validated on both regions), then
    each region fine-tuned from it (fixed fine-tuning lr, the fine-tuning budget), registered
    as global_ft."""
    import torch

    from optw.model import read_checkpoint
    from optw.tracking import champion, get_client

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # both regions in one worker, as the shipped profiles pack them (one Ray Train run a stage)
    profile = tiny_profile(f"real-{mode}", mode=mode, regions=REAL, val_every=2, pack=2)
    summary = _run(profile, real_catalog, store, tmp_path)
    _check_real_job(summary, store, tmp_path, method)
    client = get_client(store)
    if mode == "global-ft":
        assert sorted(summary.trained) == sorted(["global-cordeau", *REAL])
        models = tmp_path / "out" / "models"
        glob = read_checkpoint(models / "global-global-cordeau.pt")
        assert {"val_score/pr01", "val_score/pr02", "val_gap_ils"} <= set(
            glob["train"]["last_validation"])
        ft = torch.load(models / "finetune-pr02.pt", weights_only=True)
        assert ft["train"]["config"]["finetune"] is True and ft["train"]["epoch"] == 2
        return
    for rid in REAL:
        champ = champion(rid, uri=store)
        assert champ is not None and champ.version == summary.registered[rid]
        assert len(client.search_model_versions(f"name = 'optw-{rid}'")) == 1
    assert "summary" in summary.tables
    assert summary.report is not None and summary.report.exists()
    arts = [a.path for a in client.list_artifacts(summary.parent_run_id, "tables")]
    assert any("summary" in a for a in arts)
    report = summary.report.read_bytes()
    again = _run(profile, real_catalog, store, tmp_path)
    assert sorted(again.skipped) == sorted(REAL) and again.trained == []
    assert again.parent_run_id == summary.parent_run_id and again.report == summary.report
    assert summary.report.read_bytes() == report and again.results_path == summary.results_path
    for rid in REAL:
        assert len(client.search_model_versions(f"name = 'optw-{rid}'")) == 1


@pytest.mark.slow
def test_transfer_mode_on_real_regions(ray_cluster, real_catalog, tmp_path):
    """transfer on a Cordeau subset: the global model (trained without pr01, pr02) is
    evaluated as is (tl) and fine-tuned (ft_tl); both are in the job's tables. (`make
    test-slow`: the default suite runs the same two stages, tl then ft_tl, as test_custom_job's
    transfer-to job, and checks transfer's plan in test_plan_per_mode.)"""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    profile = tiny_profile("real-transfer", mode="transfer", regions=REAL, val_tourists=1,
                           epochs=2, pack=2)
    summary = _run(profile, real_catalog, store, tmp_path)
    df = _check_real_job(summary, store, tmp_path, "ft_tl")
    assert {"tl", "tl_greedy"} <= set(df["method"])
    assert {"tl", "ft_tl"} <= set(summary.tables["summary"]["method"])


# ----------------------------------------------------------------------------- custom regions


def test_plan_transfer_to_and_custom_groups(catalog, tmp_path):
    """transfer-to: one global model of the source groups (without the targets), evaluated as
    it is on the targets (tl), then fine-tuned on each target (ft_tl, registered); custom
    groups in profiles; its config hash depends on the source groups, other modes' do not."""
    from optw.distributed.plan import UnknownGroupError, select_regions, source_key

    (g,), f = plan("transfer-to", catalog, ["c101", "pr01"], ["solomon"])
    assert g.key == "source-solomon" and g.method == "tl" and g.eval_regions == ["c101", "pr01"]
    assert "c101" not in g.train_regions and len(g.train_regions) == 55
    assert [(u.key, u.init_from, u.method, u.register) for u in f] == [
        ("c101", "source-solomon", "ft_tl", True), ("pr01", "source-solomon", "ft_tl", True)]
    (g,), _ = plan("transfer-to", catalog, ["c101"])
    assert g.key == "source-all" and len(g.train_regions) == 108
    assert source_key(["cordeau", "solomon"]) == "source-solomon-cordeau"
    with pytest.raises(UnknownGroupError, match="custom"):
        select_regions(catalog, ["custom"], [])
    base = {"job": {"regions": ["c101"], "mode": "transfer-to"}}
    one = JobProfile.from_dict({"job": {**base["job"], "from_groups": ["solomon"]}})
    both = JobProfile.from_dict({"job": {**base["job"], "from_groups": ["solomon", "cordeau"]}})
    assert one.config_hash() != both.config_hash()
    assert JobProfile.from_dict({"job": {"groups": ["custom"]}}).job.groups == ["custom"]
    for job, word in (({"mode": "scratch", "from_groups": ["solomon"]}, "only mode"),
                      ({"mode": "transfer-to", "from_groups": ["custom"]}, "from_groups"),
                      ({"groups": ["custom", "nope"]}, "nope")):
        with pytest.raises(ConfigError, match=word):
            JobProfile.from_dict({"job": job})


def test_score_kind_accepts_the_custom_score_model():
    """score_kind may name the custom regions' score model (around_default) too."""
    from optw.train import TrainConfig

    assert TrainConfig(score_kind="around_default").score_kind == "around_default"
    with pytest.raises(ConfigError, match="around_default"):
        TrainConfig(score_kind="gaussian")


def test_a_job_learning_from_demonstrations(ray_cluster, tiny_catalog, store, tmp_path):
    """A job whose training imitates ILS demonstrations first: the job computes them beside
    the ILS baseline (Ray tasks), stores them in the catalog's baselines/demos.parquet, hands
    each worker its regions' demonstrations and logs them as each run's MLflow input; the
    models are registered. (One stage: a fine-tuning stage gets them the same way, through
    its config's ``demos``.)"""
    import pandas as pd

    from optw.baselines.demos import demos_path
    from optw.tracking import get_client

    profile = JobProfile.from_dict({
        "job": {"name": "demos", "mode": "scratch", "regions": TINY},
        "train": {"epochs": 1, "batch_size": 4, "val_every": 0, "val_tourists": 4,
                  "checkpoint_every": 0, "threads": 1, "demos": 6, "imitation_epochs": 2,
                  "imitation_batch": 4},
        "evaluate": {"beams": 2, "validation_tourists": 4, "beam_sweep": [2]},
        "resources": {"cpus_per_region": 1, "regions_per_worker": 2}}, source="test-demos")
    summary = _run(profile, tiny_catalog, store, tmp_path, force=True)
    assert set(summary.registered) == set(TINY)
    stored = pd.read_parquet(demos_path(tiny_catalog.path))
    assert {r: int((stored["region"] == r).sum()) for r in TINY} == {r: 6 for r in TINY}
    client = get_client(store)
    runs = client.search_runs(client.get_experiment_by_name("demos").experiment_id,
                              "tags.stage = 'scratch'")
    assert len(runs) == 2
    for run in runs:
        inputs = run.inputs.dataset_inputs
        assert len(inputs) == 1 and inputs[0].dataset.name == "demonstrations (6)"


def test_an_interrupted_job_leaves_no_run_running(ray_cluster, tiny_catalog, store, tmp_path):
    """SIGTERM to the driver (as `optw job run` takes it: a KeyboardInterrupt, as Ctrl-C)
    while a model trains: the parent run ends KILLED and so does the child run of the model
    being trained (it stayed RUNNING for good), the pack in flight is cancelled (its paused
    Ray Train worker goes away), and the job's --out folder carries the job's marker."""
    from optw.outdir import marker, read_marker
    from optw.raylocal import interrupt_on_signals
    from optw.tracking import get_client

    paused = tmp_path / "paused.pid"

    def interrupter():
        deadline = time.time() + 150
        while time.time() < deadline and not paused.exists():
            time.sleep(0.2)
        if paused.exists():
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    interrupt_on_signals()
    threading.Thread(target=interrupter, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            _run(tiny_profile("interrupted", regions=["r199"], epochs=6), tiny_catalog, store,
                 tmp_path, force=True, callbacks={"r199": [PauseAfterCheckpoint(str(paused))]})
    finally:
        signal.signal(signal.SIGTERM, before)
    assert paused.exists(), "the worker never reached its first checkpoint"
    client = get_client(store)
    runs = client.search_runs([client.get_experiment_by_name("interrupted").experiment_id])
    assert sorted((r.data.tags.get("stage", "job"), r.info.status) for r in runs) == [
        ("job", "KILLED"), ("scratch", "KILLED")]
    worker, deadline = int(paused.read_text()), time.time() + 60
    while time.time() < deadline and Path(f"/proc/{worker}").exists():
        time.sleep(0.5)
    assert not Path(f"/proc/{worker}").exists(), "the paused worker still runs"
    assert read_marker(tmp_path / "out" / marker("job")).name == "interrupted"
