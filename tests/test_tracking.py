"""optw.tracking against a real MLflow store: a sqlite database in a temporary folder (one per
module, so the schema is created once), plus one test with a real local ``mlflow server``.

Every test uses its own experiment / region names, so they do not depend on each other.
"""

from __future__ import annotations

import json
import logging
import pickle
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from optw.catalog import CATALOG_VERSION, PROJECT_ROOT
from optw.tracking import (
    CHAMPION,
    MlflowCallback,
    TrackingUnavailableError,
    artifact_root,
    champion,
    check_tracking_uri,
    config_hash,
    find_champion_with,
    flatten_config,
    get_client,
    git_commit,
    load_solver,
    local_server,
    log_evaluation,
    log_tables,
    model_name,
    register_version,
    server_command,
    start_child_run,
    start_job_run,
    tracking_uri,
    versions_for_run,
)
from optw.tracking import registry as registry_mod
from optw.tracking.server import free_port
from optw.train.callbacks import TrainContext

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """A fresh sqlite store for this module; ``$MLFLOW_TRACKING_URI`` points at it, so nothing
    can fall back to the project's own ``mlflow.db``."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        get_client(uri)  # create the schema once
        yield uri


def _name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def _fresh(uri: str) -> MlflowClient:
    """A client that shares nothing with the module's cached one."""
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    """A small real torch file in the optw-model layout (contents irrelevant for the registry)."""
    path = tmp_path / "model.pt"
    torch.save({"format": "optw-model", "config": {}, "state_dict": {"w": torch.zeros(2)}}, path)
    return path


# ----------------------------------------------------------------------------- URIs


def test_tracking_uri_default_env_override_and_artifact_root(monkeypatch):
    """Default store is sqlite in the project folder with mlartifacts/ beside it;
    $MLFLOW_TRACKING_URI (e.g. a server) overrides it; an explicit argument wins over both."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri() == f"sqlite:///{PROJECT_ROOT.as_posix()}/mlflow.db"
    assert artifact_root() == PROJECT_ROOT / "mlartifacts"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking_uri() == "http://127.0.0.1:5000"
    assert artifact_root() is None  # a server picks its own artifact root
    assert tracking_uri("sqlite:////x/y.db") == "sqlite:////x/y.db"


def test_unreachable_tracking_uri_fails_fast_with_clear_error(tmp_path):
    """A server nobody listens on, or a sqlite folder that does not exist, raises
    TrackingUnavailableError naming the URI within the timeout, and start_job_run checks first."""
    dead = f"http://127.0.0.1:{free_port()}"
    t0 = time.perf_counter()
    with pytest.raises(TrackingUnavailableError, match="unreachable") as err:
        check_tracking_uri(dead, timeout=1.0)
    assert dead in str(err.value)
    with pytest.raises(TrackingUnavailableError):
        start_job_run("never-created", {"a": 1}, uri=dead)
    assert time.perf_counter() - t0 < 10
    missing = f"sqlite:///{tmp_path / 'no-such-dir' / 'mlflow.db'}"
    with pytest.raises(TrackingUnavailableError, match="does not exist"):
        check_tracking_uri(missing)
    ok = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert check_tracking_uri(ok) == ok


# ----------------------------------------------------------------------------- config helpers


def test_flatten_and_hash_config_are_stable():
    """Nested configs flatten to dotted params; the hash ignores key order and changes with
    values."""
    cfg = {"lr": 1e-4, "model": {"d": 128, "heads": [8, 8]}, "out": Path("/tmp/a"), "none": None}
    assert flatten_config(None) == flatten_config({}) == {}
    flat = flatten_config(cfg)
    assert flat == {"lr": "0.0001", "model.d": "128", "model.heads": "[8, 8]",
                    "out": "/tmp/a", "none": "None"}
    same = {"none": None, "out": Path("/tmp/a"), "model": {"heads": [8, 8], "d": 128}, "lr": 1e-4}
    assert config_hash(cfg) == config_hash(same)
    assert config_hash(cfg) != config_hash({**cfg, "lr": 2e-4})


def test_git_commit_is_unknown_outside_git(tmp_path, monkeypatch):
    """The commit param is best effort: a 40-hex commit in the repo, 'unknown' without git."""
    monkeypatch.delenv("OPTW_GIT_COMMIT", raising=False)
    assert git_commit.__wrapped__(tmp_path) == "unknown"
    commit = git_commit.__wrapped__(PROJECT_ROOT)
    assert commit == "unknown" or len(commit) == 40


# ----------------------------------------------------------------------------- runs


def test_job_run_experiment_parent_and_child_params(store):
    """One experiment per job (artifacts under mlartifacts/<job> beside the sqlite file), a
    parent run with the flattened config + commit + catalog version + hash, and one child per
    (stage, region) with its parent tag; asking again for the same child returns the same run."""
    job_name = _name("job-")
    cfg = {"epochs": 10, "model": {"d": 64}}
    job = start_job_run(job_name, cfg, tags={"profile": "dev"})
    assert pickle.loads(pickle.dumps(job)) == job  # travels to Ray tasks
    client = _fresh(store)
    exp = client.get_experiment_by_name(job_name)
    assert exp.experiment_id == job.experiment_id
    assert exp.artifact_location == (artifact_root(store) / job_name).as_uri()
    parent = client.get_run(job.run_id)
    assert parent.data.params["model.d"] == "64"
    assert parent.data.params["catalog_version"] == str(CATALOG_VERSION)
    assert parent.data.params["config_hash"] == config_hash(cfg) == job.config_hash
    assert parent.data.params["git_commit"] == job.git_commit
    assert parent.data.tags["profile"] == "dev"

    child = job.child("train", "c101", {**cfg, "region": "c101"})
    assert start_child_run(job, "train", "c101", {**cfg, "region": "c101"}) == child
    other = job.child("train", "c102", cfg)
    assert other != child
    run = client.get_run(child)
    assert run.data.tags["mlflow.parentRunId"] == job.run_id
    assert (run.data.tags["stage"], run.data.tags["region"]) == ("train", "c101")
    assert run.info.run_name == "train/c101"
    assert run.data.params["region"] == "c101"
    assert run.data.params["config_hash"] == config_hash({**cfg, "region": "c101"})
    job.finish()
    assert client.get_run(job.run_id).info.status == "FINISHED"


def test_job_run_context_manager_marks_failure(store):
    """An exception inside `with start_job_run(...)` ends the parent run FAILED."""
    with pytest.raises(RuntimeError), start_job_run(_name("job-"), {"a": 1}) as job:
        raise RuntimeError("boom")
    assert _fresh(store).get_run(job.run_id).info.status == "FAILED"


def test_a_stopped_jobs_children_are_not_left_running(store):
    """A parent run ended KILLED (Ctrl-C, SIGTERM) or FAILED ends its children still RUNNING
    as KILLED (their workers are gone); finished and failed children keep their status, and a
    finished job leaves its children alone."""
    from optw.tracking.runs import end_children

    for status, exc in (("KILLED", KeyboardInterrupt), ("FAILED", RuntimeError)):
        with pytest.raises(exc), start_job_run(_name("stopped-"), {"a": 1}) as job:
            running, done, failed = (job.child("train", r) for r in ("a", "b", "c"))
            get_client(store).set_terminated(done, "FINISHED")
            get_client(store).set_terminated(failed, "FAILED")
            raise exc()
        runs = {r: _fresh(store).get_run(r).info.status for r in (running, done, failed)}
        assert runs == {running: "KILLED", done: "FINISHED", failed: "FAILED"}
        assert _fresh(store).get_run(job.run_id).info.status == status
    job = start_job_run(_name("finished-"), {"a": 1})
    child = job.child("train", "a")
    job.finish()
    assert _fresh(store).get_run(child).info.status == "RUNNING"
    assert end_children(job.run_id, "KILLED", store) == [child]


def test_unknown_tracking_schemes_are_named(store, monkeypatch):
    """A scheme MLflow has no store for is refused before any client is made, naming the
    option (or $MLFLOW_TRACKING_URI where it came from there) and what is accepted; MLflow's
    own schemes (a database's with its driver too) pass the scheme check."""
    with pytest.raises(TrackingUnavailableError) as exc:
        check_tracking_uri("bogus://x", option="--tracking-uri")
    assert str(exc.value).startswith("--tracking-uri bogus://x: MLflow has no store for the "
                                     "scheme 'bogus'; give an MLflow server (http://HOST:PORT")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "bogus://y")
    with pytest.raises(TrackingUnavailableError, match=r"^\$MLFLOW_TRACKING_URI bogus://y: "):
        check_tracking_uri()
    from optw.tracking.uri import _check_scheme

    for uri in ("postgresql+psycopg2://u@h/db", "mysql://h/db", "file:///tmp/x", "/tmp/x"):
        _check_scheme(uri, uri.split(":", 1)[0] if "://" in uri else "", "--tracking-uri")


# ----------------------------------------------------------------------------- callback

_WORKER = textwrap.dedent("""
    import pickle, sys
    from optw.train.callbacks import TrainContext
    cb = pickle.loads(open(sys.argv[1], "rb").read())
    ctx = TrainContext(region_ids=["c101"], config={"lr": 0.001, "epochs": 25}, total_epochs=25)
    for e in range(1, 26):
        ctx.epoch = e
        cb.on_epoch_end(ctx, {"mean_reward": float(e), "loss": 1.0 / e, "entropy": 0.5,
                              "lr": 0.001, "epochs_per_s": 4.0})
        if e % 10 == 0:
            cb.on_validation(ctx, {"val_score": 10.0 + e, "benchmark_score": 300.0})
    ctx.best_validation = 30.0
    ctx.last_checkpoint = sys.argv[2]
    cb.on_train_end(ctx)
""")


def test_callback_logs_from_another_process(store, checkpoint, tmp_path):
    """The driver makes the run and pickles the callback; a separate process (a Ray worker's
    situation, with its own client) logs epochs every N, validations, config and checkpoint."""
    job = start_job_run(_name("job-"), {"a": 1})
    run_id = job.child("train", "c101", {"lr": 0.001})
    cb_file = tmp_path / "cb.pkl"
    cb_file.write_bytes(pickle.dumps(MlflowCallback(run_id, uri=store, log_every=5)))
    res = subprocess.run([sys.executable, "-c", _WORKER, str(cb_file), str(checkpoint)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    client = _fresh(store)
    steps = [m.step for m in client.get_metric_history(run_id, "mean_reward")]
    assert steps == [1, 5, 10, 15, 20, 25]
    metrics = client.get_run(run_id).data.metrics
    for key in ("loss", "entropy", "lr", "epochs_per_s", "val_score", "benchmark_score",
                "best_val_score"):
        assert key in metrics, key
    assert [m.step for m in client.get_metric_history(run_id, "val_score")] == [10, 20]
    assert metrics["val_score"] == 30.0
    arts = {f.path for f in client.list_artifacts(run_id)}
    assert "config.json" in arts
    assert [f.path for f in client.list_artifacts(run_id, "checkpoints")] == [
        f"checkpoints/{checkpoint.name}"]
    assert client.get_run(run_id).data.tags["epochs_completed"] == "25"


def test_callback_batches_metrics(store, monkeypatch):
    """Epoch metrics are buffered: no request per epoch, one log_batch when flushing."""
    run_id = start_job_run(_name("job-"), {"a": 1}).child("train", "c101")
    calls = []
    real = get_client(store)

    class Counting:
        def __getattr__(self, name):
            return getattr(real, name)

        def log_batch(self, run_id, metrics=(), **kw):
            calls.append(len(metrics))
            return real.log_batch(run_id, metrics=metrics, **kw)

    monkeypatch.setattr("optw.tracking.callback.get_client", lambda uri=None: Counting())
    cb = MlflowCallback(run_id, uri=store, log_every=2, flush_every=1000, flush_seconds=1e9)
    ctx = TrainContext(region_ids=["c101"], config=None, total_epochs=100)
    for e in range(1, 21):
        ctx.epoch = e
        cb.on_epoch_end(ctx, {"mean_reward": 1.0, "loss": 2.0, "note": "not a number"})
    assert calls == []
    cb.on_validation(ctx, {"val_score": 3.0})
    assert calls == [11 * 2 + 1]  # epochs 1, 2, 4, ..., 20 x 2 numeric metrics + val_score
    assert len(_fresh(store).get_metric_history(run_id, "loss")) == 11


def test_callback_tracking_failure_does_not_stop_training(store, caplog):
    """By default a failing store is a warning (points kept for a retry after a back-off, not
    every epoch), never an exception in the training loop; strict=True raises."""
    ctx = TrainContext(region_ids=["c101"], config=None, total_epochs=3, epoch=1)
    cb = MlflowCallback(uuid.uuid4().hex, uri=store, flush_every=1)
    with caplog.at_level(logging.WARNING, logger="optw.tracking.callback"):
        cb.on_epoch_end(ctx, {"loss": 1.0})
        ctx.epoch = 2
        cb.on_epoch_end(ctx, {"loss": 1.0})
        assert cb._failures == 1  # backing off: no second request yet
        cb.on_train_end(ctx)
    assert "could not log metrics" in caplog.text
    assert cb._buffer  # kept for the next flush
    strict = MlflowCallback(uuid.uuid4().hex, uri=store, flush_every=1, strict=True)
    ctx.epoch = 1
    with pytest.raises(MlflowException):
        strict.on_epoch_end(ctx, {"loss": 1.0})


# ----------------------------------------------------------------------------- registry


def _run(stage: str = "train", region: str = "c101") -> str:
    return start_job_run(_name("job-"), {"a": 1}).child(stage, region)


def test_champion_moves_only_on_strictly_better_val_score(store, checkpoint):
    """Each registration is a new version; `champion` goes to the first version, then only to
    a strictly higher val_score (equal or worse leave it); find_champion_with matches the
    champion's config hash and catalog version."""
    region = _name("r")
    assert champion(region) is None

    def reg(score: float) -> int:
        return register_version(region, checkpoint, _run(region=region), bundle_region=False,
                                tags={"mode": "scratch", "profile": "dev", "epochs": 10,
                                      "val_score": score, "config_hash": f"h{score}",
                                      "catalog_version": CATALOG_VERSION})

    v1 = reg(0.5)
    assert champion(region) == (v1, champion(region).tags)
    assert champion(region).tags["val_score"] == "0.5"
    v2 = reg(0.7)
    assert champion(region).version == v2 > v1
    v3 = reg(0.7)  # equal: stays
    v4 = reg(0.6)  # worse: stays
    assert len({v1, v2, v3, v4}) == 4
    version, tags = champion(region)
    assert version == v2 and tags["mode"] == "scratch" and tags["epochs"] == "10"
    assert find_champion_with(region, "h0.7", CATALOG_VERSION).version == v2
    assert find_champion_with(region, "h0.6", CATALOG_VERSION) is None
    assert find_champion_with(region, "h0.7", CATALOG_VERSION + 1) is None
    aliases = _fresh(store).get_registered_model(model_name(region)).aliases
    assert aliases == {CHAMPION: str(v2)} or aliases == {CHAMPION: v2}


def test_duplicate_registration_for_same_run_returns_same_version(store, checkpoint):
    """A retried task registering the same run again gets the existing version back; no second
    version is created."""
    region = _name("r")
    run_id = _run(region=region)
    tags = {"val_score": 1.0, "config_hash": "h", "catalog_version": CATALOG_VERSION}
    v = register_version(region, checkpoint, run_id, tags, bundle_region=False)
    assert register_version(region, checkpoint, run_id, tags, bundle_region=False) == v
    assert versions_for_run(region, run_id) == [v]
    assert len(_fresh(store).search_model_versions(f"name='{model_name(region)}'")) == 1


def test_racing_registration_keeps_the_oldest_version(store, checkpoint, monkeypatch):
    """Two tries of one task racing (neither saw the other's version before creating its own):
    the later one deletes its version and returns the older one."""
    region = _name("r")
    run_id = _run(region=region)
    tags = {"val_score": 1.0}
    first = register_version(region, checkpoint, run_id, tags, bundle_region=False)
    real = registry_mod.versions_for_run
    calls = {"n": 0}

    def lookup(*a, **k):  # the first lookup misses the other try's version
        calls["n"] += 1
        return [] if calls["n"] == 1 else real(*a, **k)

    monkeypatch.setattr(registry_mod, "versions_for_run", lookup)
    assert register_version(region, checkpoint, run_id, tags, bundle_region=False) == first
    assert real(region, run_id) == [first]
    assert champion(region).version == first


def test_register_rejects_missing_checkpoint(store, tmp_path):
    """A checkpoint that does not exist is a user error naming it (a FileNotFoundError too)
    before anything is registered."""
    region = _name("r")
    from optw.errors import OptwError

    with pytest.raises(FileNotFoundError) as err:
        register_version(region, tmp_path / "nope.pt", _run(region=region), {"val_score": 1})
    assert isinstance(err.value, OptwError) and "nope.pt not found" in str(err.value)
    assert champion(region) is None


# ----------------------------------------------------------------------------- pyfunc / solver


def test_registered_model_solves_with_real_model(store, tmp_path, tiny_catalog):
    """models:/optw-<region>@champion loads a RegionSolver (version, bundled region) that turns
    tourist dicts into valid routes with the real model and decoder; the plain MLflow pyfunc
    predict takes a list of dicts and params; bad tourists are named."""
    import mlflow.pyfunc

    from optw.env import check_route
    from optw.model import ModelConfig, PointerNet, save_model

    region = tiny_catalog.region("r199")
    ckpt = save_model(PointerNet(ModelConfig()), tmp_path / "m.pt")
    version = register_version(region.id, ckpt, _run(region=region.id), {"val_score": 1.0},
                               region_data=region)
    solver = load_solver(f"models:/{model_name(region.id)}@champion", dst_path=tmp_path / "dl")
    assert solver.version == version and solver.region_id == region.id
    np.testing.assert_array_equal(solver.region.closing, region.closing)
    tourists = tiny_catalog.validation(region.id)[:2]
    sols = solver.solve(tourists.to_records(), method="beam", beams=2)
    assert len(sols) == 2
    for i, sol in enumerate(sols):
        assert check_route(region, sol.route, tourists, i, claimed_score=sol.score).ok

    n = region.n_nodes
    poi_scores = list(range(1, n - 1))  # per point of interest: start/end 0 are added
    (one,) = solver.solve({"start": [1.0, 2.0], "t_start": 5, "t_end": 200,
                           "scores": poi_scores}, method="greedy")
    assert one.route[0] == 0 and one.route[-1] == n - 1
    pyfunc = mlflow.pyfunc.load_model(solver.local_path)
    out = pyfunc.predict([{"start": [0, 0], "scores": poi_scores}, {}], params={"beams": 3})
    assert list(out.columns) == ["tourist", "route", "score", "seconds"] and len(out) == 2
    assert out["tourist"].tolist() == [0, 1]  # no ids given: the positions
    with pytest.raises(ValueError, match="scores"):
        solver.solve({"scores": [1, 2, 3]})


def test_load_solver_leaves_no_download_behind(store, tmp_path, monkeypatch, tiny_catalog):
    """load_solver without dst_path loads the model into memory and deletes its download (it
    used to leave a ~5 MB optw-model-* folder per call): three calls leave the temp folder
    empty and solve; with load=False the files live as long as the solver; with dst_path they
    stay where asked."""
    import gc
    import tempfile

    region = tiny_catalog.region("r199")
    torch.manual_seed(5)
    from optw.model import ModelConfig, PointerNet, save_model

    ckpt = save_model(PointerNet(ModelConfig()), tmp_path / "m.pt")
    register_version(region.id, ckpt, _run(region=region.id), {"val_score": 1.0},
                     region_data=region)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    ref = f"models:/{model_name(region.id)}@champion"
    for _ in range(3):
        solver = load_solver(ref)
        assert solver.local_path is None
        (sol,) = solver.solve({"start": list(region.start_xy)}, method="greedy")
        assert sol.route[0] == 0
        assert list(tmp.iterdir()) == []
    lazy = load_solver(ref, load=False)
    assert Path(lazy.local_path).is_dir() and lazy.solve({}, method="greedy")
    del lazy
    gc.collect()
    assert list(tmp.iterdir()) == []
    kept = load_solver(ref, dst_path=tmp_path / "dl")
    assert Path(kept.local_path).is_dir() and str(tmp_path / "dl") in kept.local_path


def test_pyfunc_beams_param_is_checked_not_replaced(tiny_catalog):
    """The pyfunc's beams parameter: absent -> SERVE_BEAMS, numpy integers accepted; 0 is an
    error naming beams (it used to become the default 16 silently), and so are 129, 4.5 and
    True (int() used to truncate them)."""
    from optw.decode import MAX_BEAMS

    region = tiny_catalog.region("r199")
    pyfunc = _local_pyfunc(region)
    assert len(pyfunc.predict(None, [{}], params={"beams": np.int64(3)})) == 1
    assert len(pyfunc.predict(None, [{}], params={"beams": None})) == 1
    for bad in (0, MAX_BEAMS + 1, 4.5, True, "8"):
        with pytest.raises(ValueError, match="^beams: ") as err:
            pyfunc.predict(None, [{}], params={"beams": bad})
        assert "\n" not in str(err.value)


def test_pyfunc_warns_once_when_its_model_was_trained_elsewhere(tiny_catalog, caplog):
    """The pyfunc of a region whose model was trained on other regions logs one warning line
    naming both, on its first request only (not per request); a model trained on the region,
    or one whose file does not say, logs nothing; an unknown method is refused at its edge."""
    from optw.errors import UserError

    region = tiny_catalog.region("r199")
    pyfunc = _local_pyfunc(region)
    pyfunc.model.trained_on = ("t199", "pr99")
    with caplog.at_level(logging.WARNING, logger="optw.tracking.pyfunc"):
        for _ in range(3):
            pyfunc.predict(None, [{}], params={"method": "greedy"})
    lines = [r.getMessage() for r in caplog.records if r.name == "optw.tracking.pyfunc"]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "trained on t199, pr99, not on r199 (solomon)" in lines[0]
    assert pyfunc.check_region() is not None
    caplog.clear()
    for trained in (("r199",), None):
        other = _local_pyfunc(region)
        other.model.trained_on = trained
        with caplog.at_level(logging.WARNING, logger="optw.tracking.pyfunc"):
            other.predict(None, [{}], params={"method": "greedy"})
        assert not [r for r in caplog.records if r.name == "optw.tracking.pyfunc"]
    with pytest.raises(UserError, match="^method: 'nope' is not one of"):
        pyfunc.solve([{}], method="nope")


def _local_pyfunc(region):
    """The pyfunc's model class with a region and an untrained model set (no MLflow)."""
    from optw.model import ModelConfig, PointerNet
    from optw.tracking.pyfunc import OptwSolverModel

    torch.manual_seed(11)
    model = OptwSolverModel()
    model.region_id, model._region, model._model = region.id, region, PointerNet(ModelConfig())
    return model


def test_pyfunc_echoes_string_tourist_ids(tiny_catalog):
    """The pyfunc's solve returns Solutions whose tourist is the id given ("alice", an integer,
    else the position), from records and from a DataFrame; predict's DataFrame echoes the ids
    in its first column (README: "outputs echo the tourist's id"; it had no id column)."""
    from conftest import good_tourist

    region = tiny_catalog.region("r199")
    pyfunc = _local_pyfunc(region)
    good = good_tourist(region)
    records = [good, {**good, "tourist": 7}, {k: v for k, v in good.items() if k != "tourist"}]
    for data in (records, pd.DataFrame(records[:2])):
        sols = pyfunc.solve(data, method="greedy")
        assert [s.tourist for s in sols] == ["alice", 7, 2][:len(sols)]
    (one,) = pyfunc.solve({**good, "tourist": "bob"}, method="beam", beams=2)
    assert one.tourist == "bob"
    out = pyfunc.predict(None, records, params={"beams": 2})
    assert list(out.columns) == ["tourist", "route", "score", "seconds"] and len(out) == 3
    assert out["tourist"].tolist() == ["alice", 7, 2]
    assert json.loads(out.to_json(orient="records"))[1]["tourist"] == 7


def test_pyfunc_rejects_each_generated_bad_tourist(tiny_catalog):
    """Every tourist of the generated bad family (but missing fields, which the pyfunc fills
    with the benchmark's) fails tourists_from_records and the pyfunc's solve and predict with a
    one-line TouristError naming the tourist and the field, as a record list, a dict or a
    DataFrame row."""
    from conftest import assert_names_field, bad_tourists, good_tourist
    from optw.catalog import TouristError
    from optw.tracking.pyfunc import tourists_from_records

    for rid in ("r199", "t199"):
        region = tiny_catalog.region(rid)
        pyfunc = _local_pyfunc(region)
        good = good_tourist(region)
        for case, bad, field in bad_tourists(region, required=False):
            for data, index in (([good, bad], 1), (bad, 0), (pd.DataFrame([bad]), 0)):
                with pytest.raises(TouristError) as err:
                    tourists_from_records(region, data)
                assert err.value.field == field and err.value.index == index, (rid, case)
                assert_names_field(str(err.value), field)
            with pytest.raises(ValueError, match=f"^tourist 1.*{field.split('[')[0]}"):
                pyfunc.solve([good, bad], method="greedy")
            with pytest.raises(TouristError):
                pyfunc.predict(None, [bad])
        with pytest.raises(TouristError, match="start_xy: give start or start_xy"):
            tourists_from_records(region, {**good, "start_xy": [1, 2]})


# ----------------------------------------------------------------------------- evaluation


def test_log_evaluation_metrics_and_tables(store, tmp_path):
    """Per-method mean score / gap / seconds become metrics; the table is logged as CSV and
    Markdown; log_tables logs plain tables."""
    run_id = _run("evaluate")
    table = pd.DataFrame({"region": ["c101"] * 4, "method": ["beam", "beam", "greedy", "ils"],
                          "score": [300.0, 310.0, 280.0, 320.0], "gap": [0.06, 0.03, 0.12, 0.0],
                          "seconds": [0.1, 0.3, 0.05, 2.0]})
    metrics = log_evaluation(run_id, table, "benchmark")
    assert metrics["benchmark/beam/mean_score"] == pytest.approx(305.0)
    assert metrics["benchmark/greedy/mean_gap"] == pytest.approx(0.12)
    assert metrics["benchmark/ils/mean_seconds"] == pytest.approx(2.0)
    client = _fresh(store)
    logged = client.get_run(run_id).data.metrics
    assert logged["benchmark/beam/mean_gap"] == pytest.approx(0.045)
    arts = {f.path for f in client.list_artifacts(run_id, "evaluation")}
    assert arts == {"evaluation/benchmark.csv", "evaluation/benchmark.md"}
    log_tables(run_id, {"summary": table.groupby("method", as_index=False)["score"].mean()})
    local = Path(client.download_artifacts(run_id, "tables/summary.md", str(tmp_path)))
    md = local.read_text()
    assert md.splitlines()[0] == "| method | score |" and "| beam | 305 |" in md
    with pytest.raises(ValueError, match="score"):
        log_evaluation(run_id, table.drop(columns="score"), "broken")


# ----------------------------------------------------------------------------- server


def test_server_command_uses_valid_mlflow_flags():
    """Every flag of server_command exists in this MLflow's `mlflow server` (one worker,
    project sqlite store, proxied artifacts into mlartifacts/)."""
    from mlflow.cli import server

    cmd = server_command(port=5123)
    known = {opt for p in server.params for opt in (*p.opts, *p.secondary_opts)}
    assert {a for a in cmd if a.startswith("--")} <= known
    assert cmd[cmd.index("--workers") + 1] == "1"
    assert cmd[cmd.index("--port") + 1] == "5123"
    assert cmd[cmd.index("--backend-store-uri") + 1] == \
        f"sqlite:///{PROJECT_ROOT.as_posix()}/mlflow.db"
    assert cmd[cmd.index("--artifacts-destination") + 1] == \
        (PROJECT_ROOT / "mlartifacts").as_uri()


def _server_processes(port: str) -> list[int]:
    """Pids in the process group of the `mlflow server` listening on ``port`` (Linux /proc)."""
    procs = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
                pgid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[2])
                procs[int(d.name)] = (cmd, pgid)
            except (OSError, IndexError, ValueError):
                continue
    leaders = [pid for pid, (cmd, pgid) in procs.items()
               if b"server" in cmd and port.encode() in cmd and b"mlflow" in cmd]
    groups = {procs[pid][1] for pid in leaders}
    return [pid for pid, (_, pgid) in procs.items() if pgid in groups]


def test_local_server_round_trip(tmp_path, monkeypatch):
    """A real `mlflow server` (one worker, no job runner) on a free loopback port: a job logs a
    run, a metric and an artifact through MLFLOW_TRACKING_URI=http://..., then the server is
    stopped."""
    backend = f"sqlite:///{tmp_path / 'server.db'}"
    with local_server(backend_store_uri=backend, artifacts_destination=tmp_path / "art",
                      startup_timeout=90, log_file=tmp_path / "server.log") as uri:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        assert check_tracking_uri() == uri
        assert 1 <= len(_server_processes(uri.rsplit(":", 1)[1])) <= 2  # mlflow + 1 uvicorn
        job = start_job_run("server-job", {"a": 1})
        assert job.tracking_uri == uri and job.url.startswith(uri)
        run_id = job.child("train", "c101")
        get_client().log_metric(run_id, "val_score", 1.5)
        get_client().log_text(run_id, "hello", "notes/hello.txt")
        job.finish()
        client = MlflowClient(tracking_uri=uri)
        assert client.get_run(run_id).data.metrics["val_score"] == 1.5
        assert client.get_run(job.run_id).info.status == "FINISHED"
    assert any(p.name == "hello.txt" for p in (tmp_path / "art").rglob("*"))
    with pytest.raises(TrackingUnavailableError):
        check_tracking_uri(uri, timeout=1.0)
