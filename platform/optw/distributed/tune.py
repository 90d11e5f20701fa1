"""Ray Tune (ASHA) sweeps of the training hyper-parameters, compared by the mean gap to ILS;
each trial runs one TorchTrainer (Ray Train V2 does not nest a Trainer in a Tuner)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optw import paths
from optw.checks import integer, number
from optw.distributed import storage as st
from optw.distributed.mirror import local_catalog
from optw.distributed.preflight import CATALOG_SETTING, Setting, join_cluster
from optw.distributed.profile import JobProfile, load_profile
from optw.distributed.ray_train import WorkerError, WorkerSpec, fit_checked, make_trainer
from optw.errors import ConfigError, OptwError, UserError
from optw.train.config import TrainConfig, check_fits

if TYPE_CHECKING:
    from optw.catalog import Catalog

METRIC = "val_gap_ils"
DEFAULT_SAMPLES, MAX_SAMPLES = 8, 10_000  # trials of a sweep (--samples)
KINDS = {"loguniform": 2, "uniform": 2, "choice": 1}  # the space's kinds: how many values
#: Default search space: keys of TrainConfig, or model.<key> for ModelConfig.
DEFAULT_SPACE = {"lr": ("loguniform", 1e-5, 1e-3), "batch_size": ("choice", [16, 32, 64]),
                 "beta": ("loguniform", 1e-3, 1e-1), "model.clip": ("choice", [5.0, 10.0, 20.0]),
                 "model.n_layers": ("choice", [1, 2, 3])}


class SweepError(OptwError, RuntimeError):
    """A sweep none of whose trials reported a gap to ILS (their errors named)."""


class OutputExistsError(OptwError, FileExistsError):
    """An output of a sweep that exists and is not overwritten."""


def apply_trial(config: TrainConfig, trial: dict[str, Any]) -> TrainConfig:
    """``config`` with a trial's values (``model.x`` keys go to the model table)."""
    model = {k.removeprefix("model."): v for k, v in trial.items() if k.startswith("model.")}
    other = {k: v for k, v in trial.items() if not k.startswith("model.")}
    return TrainConfig.from_dict({**config.to_dict(), "model": {**config.model, **model},
                                  **other}, source="tune trial")


def check_space(config: TrainConfig, spec: dict[str, tuple], n_nodes: int) -> None:
    """Refuse a malformed spec, or a value it may draw that makes an invalid config."""
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
            raise ConfigError(f"search space {key} = {entry!r}: expected two finite ends low < "
                              f"high{' and low > 0' if kind == 'loguniform' else ''}", key)
        for value in args[0] if kind == "choice" else args:
            where = f"search space {key} = {value!r}"
            try:
                trial = apply_trial(config, {key: value})
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}", key) from None
            check_fits(trial, n_nodes, where)


@dataclass
class SweepResult:
    best_config: dict[str, Any]  # the best trial's [train] table (the sweep's epochs)
    best_gap: float
    trials: Any  # pandas DataFrame
    best_trial: dict[str, Any]  # only the values it drew (what :func:`write_profile` applies)


def run_sweep(profile: JobProfile, regions: list[str], num_samples: int = DEFAULT_SAMPLES,
              space: dict[str, tuple] | None = None, catalog_dir: str | Path | None = None,
              tracking_uri: str | None = None, storage: str | Path | None = None,
              progress: bool = True, name: str | None = None,
              ray_address: str | None = None) -> SweepResult:
    """ASHA sweep over ``space`` on ``regions`` with the profile's [train] as the base."""
    import pandas as pd
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import BasicVariantGenerator

    from optw.baselines import run_ils_baseline
    from optw.distributed.job import open_job_catalog
    from optw.distributed.rayenv import check_address
    from optw.tracking import check_tracking_uri, log_params, log_tables, set_tags, start_job_run
    from optw.tracking.runs import end_run, start_child_run

    if not integer(num_samples) or not 1 <= num_samples <= MAX_SAMPLES:
        raise UserError(f"--samples: {num_samples!r} trials; give an integer in "
                        f"1..{MAX_SAMPLES:,}")
    if not regions:
        raise UserError("--regions: no region to tune on")
    name = name or f"{profile.job.name}-tune-{time.strftime('%Y%m%d-%H%M%S')}"
    if any(c in name for c in "/\\ ") or not name.isprintable():
        raise UserError(f"--name: {name!r} must be a non-empty word")
    storage = st.normalize(storage or paths.tune_storage())
    catalog_loc, catalog = open_job_catalog(catalog_dir)
    for rid in regions:
        catalog.region(rid)
    space = space or DEFAULT_SPACE
    train = profile.train.replace(regions=list(regions))
    if not train.val_every:  # validate every quarter of the epochs
        train = train.replace(val_every=max(1, train.epochs // 4))
    n_nodes = int(catalog.regions_table["nodes"].loc[list(regions)].max())
    check_fits(train, n_nodes, f"{profile.profile} [train]")
    check_space(train, space, n_nodes)
    grace = train.val_every
    if grace > train.epochs:  # ASHA would stop trials before their first validation
        raise UserError(f"--val-every {grace} is more than --epochs {train.epochs}: a trial "
                        "would end before its first validation; give --val-every <= --epochs")
    search = {key: getattr(tune, kind)(*args) for key, (kind, *args) in space.items()}
    uri = check_tracking_uri(tracking_uri)
    folder = Setting("--storage or --out (or OPTW_STORAGE)", storage)
    st.prepare_folders([folder], create=False)
    if not ray.is_initialized():
        check_address(ray_address)  # a bad --address: refused in seconds
    if st.exists(st.join(storage, name)):
        raise OutputExistsError(f"--name: a sweep {name!r} already exists in "
                                f"{st.shown(storage)}; choose another --name (or --storage) so "
                                "it is not overwritten")
    _, use_gpu = join_cluster([folder], Setting(CATALOG_SETTING, catalog_loc), catalog.path,
                              uri, profile, ray_address)
    run_ils_baseline(catalog.path, regions=regions, tourists="validation", progress=progress,
                     task_catalog=catalog_loc, localize=local_catalog)
    job = start_job_run(name, {"profile": profile.to_dict(), "space": {
        k: list(map(str, v)) for k, v in space.items()}, "regions": list(regions)},
        tags={"kind": "tune"}, uri=uri)
    base = WorkerSpec.build(train, "+".join(regions), "tune", catalog=catalog_loc,
                            tracking_uri=uri, run_id=None)

    def trial(config: dict[str, Any]) -> None:
        """One trial: a TorchTrainer of the drawn values, logged to its own MLflow child run."""
        from ray.tune.integration.ray_train import TuneReportCallback

        drawn, status = config["trial"], "FAILED"
        run_id = start_child_run(job, "trial", tune.get_context().get_trial_id(), config=drawn,
                                 uri=uri)
        run = f"{name}-{int(time.time() * 1000) % 10**9}"
        try:
            spec = replace(base, run_id=run_id, config=apply_trial(base.config, drawn))
            trainer = make_trainer(spec, storage, run, profile.resources, use_gpu,
                                   max_failures=0, callbacks=[TuneReportCallback()])
            try:
                fit_checked(trainer, storage, run)
            except WorkerError as exc:  # as its result, Tune prints no traceback
                tune.report({"optw_error": str(exc)})
            status = "FINISHED"
        finally:
            end_run(run_id, status, uri)

    scheduler = ASHAScheduler(time_attr="epoch", max_t=train.epochs, grace_period=grace,
                              reduction_factor=2)
    # reports between validations carry no val_gap_ils; the scheduler skips those
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    # verbose=0 silences Tune's tables in its older output engine only
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    trial_cpu = 0.01  # a trial only waits on its TorchTrainer, whose worker holds the CPUs
    storage_path, storage_fs = st.ray_storage(storage)
    capacity = max(1, int((ray.cluster_resources().get("CPU", 1) - trial_cpu * num_samples)
                          // profile.resources.cpus_per_region))
    tuner = tune.Tuner(
        tune.with_resources(trial, {"cpu": trial_cpu}), param_space={"trial": search},
        tune_config=tune.TuneConfig(
            metric=METRIC, mode="min", scheduler=scheduler, num_samples=num_samples,
            search_alg=BasicVariantGenerator(random_state=0, max_concurrent=capacity)),
        run_config=tune.RunConfig(
            name=name, storage_path=storage_path, storage_filesystem=storage_fs, verbose=0,
            callbacks=[trial_lines(num_samples)] if progress else []))
    rows = []
    for res in tuner.fit():
        m = res.metrics or {}
        error = m.get("optw_error") or (st.first_line(res.error) if res.error else "")
        rows.append({**{f"trial.{k}": v for k, v in (res.config or {}).get("trial", {}).items()},
                     METRIC: m.get(METRIC), "epoch": m.get("epoch"),
                     "val_score": m.get("val_score"), "error": error})
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
    return SweepResult(best_train, float(best[METRIC]), trials, best_trial)


def trial_lines(total: int):
    """A Tune callback printing one line per finished trial instead of Tune's tables."""
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


def profile_name(path: str | Path) -> str:
    """The job name of a written profile: its file's stem, with ``-`` for ``/\\`` and spaces."""
    name = "".join("-" if c in "/\\ " else c for c in Path(path).stem.strip()).strip("-")
    return name or "tuned"


def pick_best(trials: Any) -> tuple[Any, dict[str, Any]]:
    """The trials' row with the smallest gap to ILS and the values it drew (Python numbers)."""
    ok = trials.dropna(subset=[METRIC])
    if ok.empty:
        errors = sorted({str(e) for e in trials.get("error", []) if e})
        raise SweepError(f"no trial of {len(trials)} reported {METRIC}; "
                         + (f"their errors: {'; '.join(errors[:3])}" if errors
                            else "none reported an error"))
    best = ok.sort_values(METRIC).iloc[0]
    drawn = {k.removeprefix("trial."): v.item() if hasattr(v, "item") else v  # numpy -> Python
             for k, v in best.items() if k.startswith("trial.")}
    return best, drawn


def new_profile_path(path: str | Path) -> Path:
    """``path`` unless something is there (:class:`OutputExistsError`)."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise OutputExistsError(f"--write-profile: {path} exists; choose a new file so it is "
                                "not overwritten")
    return path


def write_profile(base: JobProfile, best_trial: dict[str, Any], path: str | Path,
                  catalog: Catalog | None = None) -> Path:
    """Write ``base`` with the best trial's values in ``[train]`` as a new profile file."""
    path = new_profile_path(path)
    data = base.to_dict()
    data.pop("profile")
    data["job"]["name"] = profile_name(path)
    data["train"] = apply_trial(base.train, best_trial).to_dict()
    data["train"].pop("regions", None)
    text = _toml(data)
    try:
        with open(path, "x") as f:  # never overwrites
            f.write(text)
    except OSError as exc:  # one made meanwhile too
        raise paths.path_error(exc, path) from None
    try:
        load_profile(path, catalog)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def _toml(data: dict[str, Any]) -> str:
    """Profile tables as TOML: values as JSON (which TOML reads alike), one level of sub-tables."""
    def value(v: Any) -> str:
        return json.dumps(v.item() if hasattr(v, "item") else v)  # numpy scalars as Python's

    lines: list[str] = ["# written by jobs/tune.py"]
    for table, content in data.items():
        lines += ["", f"[{table}]"] + [f"{k} = {value(v)}" for k, v in content.items()
                                       if v is not None and not isinstance(v, dict)]
        for k, v in content.items():
            if isinstance(v, dict):
                lines += ["", f"[{table}.{k}]"] + [f"{kk} = {value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"
