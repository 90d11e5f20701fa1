"""Ray Tune sweeps of the training hyper-parameters, compared by gap to ILS.

Each trial is a function that runs one TorchTrainer (Ray Train V2 does not nest a Trainer in a
Tuner); Train's reports reach Tune through ``TuneReportCallback``. Trials are compared by
``val_gap_ils``: the mean over the chosen regions of the gap of the greedy validation score to
the ILS score of the same validation tourists (raw scores differ by region). ASHA stops the
poor ones early. Results and the best config go to MLflow; the best config can be written as a
profile file (:func:`write_profile`: the base profile with the best trial's drawn values, the
base profile's epoch budget and a job name of its own).

Storage is a location like the job's (a folder, shared on a cluster, or a URI such as
``s3://bucket/optw``; default ``$OPTW_STORAGE/ray_tune`` or ``runs/ray_tune``), and a catalog
given by URI is mirrored by every worker on entry (:mod:`optw.distributed.mirror`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optw import paths
from optw.distributed import storage as st
from optw.distributed.mirror import local_catalog
from optw.distributed.preflight import Setting, check_cluster, check_worker_fits
from optw.distributed.profile import JobProfile, ResourcesSection, load_profile
from optw.distributed.ray_train import WorkerError, WorkerSpec, fit_checked, make_trainer
from optw.errors import ConfigError, OptwError, UserError
from optw.paths import path_error
from optw.train.config import TrainConfig

if TYPE_CHECKING:
    from optw.catalog import Catalog

METRIC = "val_gap_ils"
#: Trials of a sweep (``--samples``): the default and the most.
DEFAULT_SAMPLES, MAX_SAMPLES = 8, 10_000
#: The search space's kinds: how many values each takes.
KINDS = {"loguniform": 2, "uniform": 2, "choice": 1}
#: The setting that chooses the sweep's storage, as errors name it.
STORAGE_SETTING = "--storage or --out (or OPTW_STORAGE)"
CATALOG_SETTING = "--catalog (or OPTW_CATALOG)"

#: Default search space: keys of TrainConfig, or model.<key> for ModelConfig.
DEFAULT_SPACE = {
    "lr": ("loguniform", 1e-5, 1e-3),
    "batch_size": ("choice", [16, 32, 64]),
    "beta": ("loguniform", 1e-3, 1e-1),
    "model.clip": ("choice", [5.0, 10.0, 20.0]),
    "model.n_layers": ("choice", [1, 2, 3]),
}


class SweepError(OptwError, RuntimeError):
    """A sweep none of whose trials reported a gap to ILS (their errors named)."""


class OutputExistsError(OptwError, FileExistsError):
    """An output of a sweep that exists and is not overwritten."""


def search_space(spec: dict[str, tuple]) -> dict[str, Any]:
    """Tune's search space of a checked spec (:func:`check_space`)."""
    from ray import tune

    makers = {"loguniform": tune.loguniform, "uniform": tune.uniform, "choice": tune.choice}
    return {key: makers[kind](*args) for key, (kind, *args) in spec.items()}


def apply_trial(config: TrainConfig, trial: dict[str, Any]) -> TrainConfig:
    """``config`` with a trial's values (``model.x`` keys go to the model table); a bad value
    is a :class:`~optw.errors.ConfigError` naming the key."""
    changes: dict[str, Any] = {"model": dict(config.model)}
    for key, value in trial.items():
        if key.startswith("model."):
            changes["model"][key.split(".", 1)[1]] = value
        else:
            changes[key] = value
    return TrainConfig.from_dict({**config.to_dict(), **changes}, source="tune trial")


def check_space(config: TrainConfig, spec: dict[str, tuple], n_nodes: int | None = None,
                ) -> None:
    """Fail before any trial starts when the spec is malformed (a kind of :data:`KINDS` with
    its values: a non-empty list to choose from, or the two finite ends ``low < high`` of a
    range, ``low > 0`` for ``loguniform``) or a value the sweep may draw (every choice, both
    ends of a range) makes an invalid config, or (with ``n_nodes``, the largest region's)
    one whose epoch does not fit in this machine's memory."""
    from optw.checks import number
    from optw.train.config import check_fits

    for key, entry in spec.items():
        kind, *args = entry if isinstance(entry, (tuple, list)) and entry else (None,)
        if kind not in KINDS or len(args) != KINDS[kind]:
            raise ConfigError(f"search space {key} = {entry!r}: expected (kind, values...) with "
                              f"a kind of {sorted(KINDS)}: ('choice', [values]), "
                              "('uniform', low, high) or ('loguniform', low, high)", key)
        if kind == "choice" and (not isinstance(args[0], list) or not args[0]):
            raise ConfigError(f"search space {key}: choice needs a non-empty list of values",
                              key)
        if kind != "choice" and not (all(number(v) for v in args) and args[0] < args[1]
                                     and (kind == "uniform" or args[0] > 0)):
            raise ConfigError(f"search space {key} = {entry!r}: expected two finite ends "
                              f"low < high{' and low > 0' if kind == 'loguniform' else ''}",
                              key)
        for value in args[0] if kind == "choice" else args:
            where = f"search space {key} = {value!r}"
            try:
                trial = apply_trial(config, {key: value})
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}", key) from None
            if n_nodes is not None:
                check_fits(trial, n_nodes, where)


def trial_fn(spec: WorkerSpec, trial: dict[str, Any], storage: str, name: str,
             resources: ResourcesSection, use_gpu: bool) -> None:
    """One Tune trial: a TorchTrainer on the spec's regions, reports relayed to Tune."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    run = f"{name}-{int(time.time() * 1000) % 10**9}"
    trainer = make_trainer(spec.replace(config=apply_trial(spec.config, trial)), storage, run,
                           resources, use_gpu, max_failures=0,
                           callbacks=[TuneReportCallback()])
    try:
        fit_checked(trainer, storage, run)
    except WorkerError as exc:  # the trial's error, as its result (Tune prints no traceback)
        tune.report({"optw_error": str(exc)})


@dataclass
class SweepResult:
    best_config: dict[str, Any]  # the best trial's whole [train] table (the sweep's epochs)
    best_gap: float
    trials: Any  # pandas DataFrame
    parent_run_id: str
    #: only the values the best trial drew (what :func:`write_profile` applies)
    best_trial: dict[str, Any] = field(default_factory=dict)


def run_sweep(profile: JobProfile, regions: list[str], num_samples: int = DEFAULT_SAMPLES,
              space: dict[str, tuple] | None = None, grace_epochs: int | None = None,
              catalog_dir: str | Path | None = None, tracking_uri: str | None = None,
              storage: str | Path | None = None, seed: int = 0,
              progress: bool = True, name: str | None = None,
              ray_address: str | None = None) -> SweepResult:
    """ASHA sweep over ``space`` on ``regions`` with the profile's [train] as the base.

    ``name`` (default ``<job>-tune-<time>``) names the sweep's MLflow experiment and its
    folder under ``storage`` (a folder or a URI; default :func:`optw.paths.tune_storage`); an
    existing sweep is never overwritten. ``catalog_dir`` may be a URI (each worker mirrors
    it). Everything the options can get wrong fails before Ray starts. A base profile without
    periodic validation (``val_every = 0``) validates every quarter of its epochs (Tune's
    scheduler compares trials at validations)."""
    import pandas as pd
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import BasicVariantGenerator

    from optw.baselines import run_ils_baseline
    from optw.distributed.job import open_job_catalog
    from optw.distributed.rayenv import check_address, connect
    from optw.tracking import check_tracking_uri, log_params, log_tables, set_tags, start_job_run
    from optw.tracking.runs import end_run, start_child_run
    from optw.train.config import check_fits

    if type(num_samples) is not int or not 1 <= num_samples <= MAX_SAMPLES:
        raise UserError(f"--samples: {num_samples!r} trials; give an integer in "
                        f"1..{MAX_SAMPLES:,}")
    if not regions:
        raise UserError("--regions: no region to tune on")
    name = name or f"{profile.job.name}-tune-{time.strftime('%Y%m%d-%H%M%S')}"
    if not name or any(c in name for c in "/\\ ") or not name.isprintable():
        raise UserError(f"--name: {name!r} must be a non-empty word")
    storage = st.normalize(storage or paths.tune_storage())
    catalog_loc, catalog = open_job_catalog(catalog_dir)
    for rid in regions:
        catalog.region(rid)
    space = space or DEFAULT_SPACE
    train = profile.train.replace(regions=list(regions))
    if not train.val_every:
        train = train.replace(val_every=max(1, train.epochs // 4))
    n_nodes = int(catalog.regions_table["nodes"].loc[list(regions)].max())
    check_fits(train, n_nodes, f"{profile.profile} [train]")
    check_space(train, space, n_nodes)
    check_schedule(train.epochs, grace_epochs or train.val_every)
    search = search_space(space)
    uri = check_tracking_uri(tracking_uri)
    st.check_folders([(STORAGE_SETTING, storage)])
    if not ray.is_initialized():
        check_address(ray_address)  # a bad --address: refused in seconds
    if st.exists(st.join(storage, name)):
        raise OutputExistsError(f"--name: a sweep {name!r} already exists in "
                                f"{st.shown(storage)}; choose another --name (or --storage) so "
                                "it is not overwritten")
    if not ray.is_initialized():
        connect(ray_address)
    check_worker_fits(profile.resources.cpus_per_region,
                      profile.resources.gpu_fraction
                      if ray.cluster_resources().get("GPU", 0) > 0 else None,
                      where=f"{profile.profile} [resources]")
    st.prepare_folders([(STORAGE_SETTING, storage)])
    # on a cluster of several nodes: the job's early check (every node reaches the storage and
    # gets the catalog's mirror, which ILS tasks and trials refresh on entry; the tracking
    # store is a server)
    check_cluster([Setting(STORAGE_SETTING, storage), Setting(CATALOG_SETTING, catalog_loc)],
                  uri, stage_catalogs={catalog_loc: str(catalog.path)}
                  if st.is_uri(catalog_loc) else None)
    use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    run_ils_baseline(catalog.path, regions=regions, tourists="validation", progress=progress,
                     task_catalog=catalog_loc, localize=local_catalog)
    job = start_job_run(name, {"profile": profile.to_dict(), "space": {
        k: list(map(str, v)) for k, v in space.items()}, "regions": list(regions)},
        tags={"kind": "tune"}, uri=uri)
    base = WorkerSpec.build(train, "+".join(regions), "tune", catalog=catalog_loc,
                            tracking_uri=uri, run_id=None)

    def trial_with_run(config: dict[str, Any]) -> None:
        # every trial logs to its own MLflow child run
        trial_id = tune.get_context().get_trial_id()
        run_id = start_child_run(job, "trial", trial_id, config=config["trial"], uri=uri)
        try:
            trial_fn(base.replace(run_id=run_id), config["trial"], storage, name,
                     profile.resources, use_gpu)
            end_run(run_id, "FINISHED", uri)
        except BaseException:
            end_run(run_id, "FAILED", uri)
            raise

    scheduler = ASHAScheduler(time_attr="epoch", max_t=train.epochs,
                              grace_period=grace_epochs or train.val_every, reduction_factor=2)
    # Reports between validations carry no val_gap_ils; the scheduler skips those.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    # Tune's tables and notes stay off the terminal: verbose=0 silences them in Tune's older
    # output engine only (the newer prints the experiment's table whatever the verbosity)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # the trial function only waits on its TorchTrainer, whose worker holds the real resources
    trial_cpu = 0.01
    storage_path, storage_fs = st.ray_storage(storage)
    capacity = max(1, int((ray.cluster_resources().get("CPU", 1) - trial_cpu * num_samples)
                          // profile.resources.cpus_per_region))
    tuner = tune.Tuner(
        tune.with_resources(trial_with_run, {"cpu": trial_cpu}),
        param_space={"trial": search},
        tune_config=tune.TuneConfig(metric=METRIC, mode="min", scheduler=scheduler,
                                    num_samples=num_samples,
                                    search_alg=BasicVariantGenerator(
                                        random_state=seed, max_concurrent=capacity)),
        # Tune's own tables stay off the terminal: a line per finished trial instead
        run_config=tune.RunConfig(name=name, storage_path=storage_path,
                                  storage_filesystem=storage_fs, verbose=0,
                                  callbacks=[trial_lines(num_samples)] if progress else []),
    )
    grid = tuner.fit()
    rows = []
    for res in grid:
        m = res.metrics or {}
        rows.append({**{f"trial.{k}": v for k, v in (res.config or {}).get("trial", {}).items()},
                     METRIC: m.get(METRIC), "epoch": m.get("epoch"),
                     "val_score": m.get("val_score"),
                     "error": m.get("optw_error") or _first_line(res.error)})
    trials = pd.DataFrame(rows)
    try:
        best, best_trial = pick_best(trials)
    except SweepError:
        job.finish("FAILED")
        raise
    best_train = apply_trial(train, best_trial).to_dict()
    best_train.pop("regions")
    log_tables(job.run_id, {"trials": trials}, uri=uri)
    log_params(job.run_id, {f"best.{k}": v for k, v in best_trial.items()}, uri)
    set_tags(job.run_id, {"best_val_gap_ils": float(best[METRIC])}, uri)
    job.finish("FINISHED")
    return SweepResult(best_train, float(best[METRIC]), trials, job.run_id, best_trial)


def _first_line(error: Any) -> str:
    """The first line of a trial's error (Tune's carries the whole traceback), or ""."""
    text = str(error or "").strip()
    return text.splitlines()[0] if text else ""


def trial_lines(total: int):
    """A Tune callback printing one line per finished trial (Tune's own tables stay off the
    terminal): its number, its gap to ILS or its error, and the values it drew."""
    from ray import tune

    class TrialLines(tune.Callback):
        def __init__(self) -> None:
            self.done = 0

        def _line(self, trial: Any, what: str) -> None:
            self.done += 1
            drawn = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                              for k, v in (trial.config or {}).get("trial", {}).items())
            print(f"trial {self.done}/{total}: {what} ({drawn})", flush=True)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info) -> None:
            result = trial.last_result or {}
            if result.get("optw_error"):
                self._line(trial, f"failed: {result['optw_error']}")
            elif result.get(METRIC) is not None:
                self._line(trial, f"gap to ILS {result[METRIC]:.2f}% at epoch "
                                  f"{result.get('epoch', '?')}")
            else:
                self._line(trial, "ended without a validation")

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info) -> None:
            self._line(trial, "failed (its error is in the sweep's folder and Ray's logs)")

    return TrialLines()


def check_schedule(epochs: int, grace: int) -> None:
    """ASHA stops a trial no earlier than ``grace`` epochs (the first validation) and no later
    than ``epochs``: a grace period past the budget is refused naming the options."""
    if grace > epochs:
        raise UserError(f"--val-every {grace} is more than --epochs {epochs}: a trial would "
                        "end before its first validation; give --val-every <= --epochs")


def profile_name(path: str | Path) -> str:
    """The job name a written profile gets: its file's stem as a word (``best.toml`` ->
    ``best``; characters a job name may not hold become ``-``)."""
    stem = Path(path).stem.strip()
    name = "".join("-" if c in "/\\ " else c for c in stem).strip("-")
    return name or "tuned"


def pick_best(trials: Any) -> tuple[Any, dict[str, Any]]:
    """The best trial of a sweep's trials table (one row per trial: its ``trial.<key>`` values,
    its last ``METRIC``): the row with the smallest gap to ILS among those that reported one,
    and the values it drew (plain Python numbers). :class:`SweepError` naming the trials'
    errors when none reported."""
    ok = trials.dropna(subset=[METRIC])
    if ok.empty:
        errors = sorted({str(e) for e in trials.get("error", []) if e})
        raise SweepError(f"no trial of {len(trials)} reported {METRIC}; "
                         + (f"their errors: {'; '.join(errors[:3])}" if errors
                            else "none reported an error"))
    best = ok.sort_values(METRIC).iloc[0]
    drawn = {k[len("trial."):]: v.item() if hasattr(v, "item") else v  # numpy -> Python
             for k, v in best.items() if k.startswith("trial.")}
    return best, drawn


def new_profile_path(path: str | Path) -> Path:
    """``path`` for :func:`write_profile` (``--write-profile``, checked before a sweep starts):
    an :class:`OutputExistsError` when something is there, which is never overwritten."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise OutputExistsError(f"--write-profile: {path} exists; choose a new file so it is "
                                "not overwritten")
    return path


def write_profile(base: JobProfile, best_trial: dict[str, Any], path: str | Path,
                  name: str | None = None, catalog: Catalog | None = None) -> Path:
    """Write ``base`` (the profile the sweep started from, before ``--epochs`` /
    ``--val-every``) with the best trial's drawn values applied to its ``[train]`` table, as
    TOML: the training budget (epochs, validation interval) stays the base profile's (a sweep's
    short budget only ranks the trials) and ``[job] name`` becomes ``name`` (default: the
    file's stem, :func:`profile_name`) so the tuned models are not registered as the base
    job's. Refuses an existing file. ``catalog``: the one whose custom groups ``base`` may
    name (the written profile is loaded back, checked)."""
    path = new_profile_path(path)
    data = base.to_dict()
    data.pop("profile")
    data["job"]["name"] = name or profile_name(path)
    data["train"] = apply_trial(base.train, best_trial).to_dict()
    data["train"].pop("regions", None)
    text = _toml(data)
    try:
        with open(path, "x") as f:  # never overwrites
            f.write(text)
    except FileExistsError:
        raise OutputExistsError(f"--write-profile: {path} exists; choose a new file so it is "
                                "not overwritten") from None
    except OSError as exc:
        raise path_error(exc, path) from None
    try:
        load_profile(path, catalog)  # what we wrote must load back as a valid profile
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def _toml(data: dict[str, Any]) -> str:
    """A small TOML writer for profile tables (scalars, lists, one level of sub-tables)."""
    import json

    def value(v: Any) -> str:
        if hasattr(v, "item"):  # numpy scalars from the trials table
            v = v.item()
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(f"cannot write {v!r} to TOML")

    lines: list[str] = ["# written by jobs/tune.py"]
    for table, content in data.items():
        subs = {k: v for k, v in content.items() if isinstance(v, dict)}
        lines += ["", f"[{table}]"]
        lines += [f"{k} = {value(v)}" for k, v in content.items()
                  if v is not None and not isinstance(v, dict)]
        for k, v in subs.items():
            lines += ["", f"[{table}.{k}]"] + [f"{kk} = {value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"
