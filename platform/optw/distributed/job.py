"""The platform job: ILS baseline, one Ray Train run per model, evaluation, MLflow, registry.

``jobs/train_all.py`` is a thin wrapper around :func:`run_job`. Everything that can be wrong
with the input (profile, regions, groups, tracking store, and on a cluster of several nodes
every location some node cannot reach) fails before any training starts.

Where things go (:mod:`optw.distributed.storage`): Ray Train's checkpoints under ``storage``,
the final models, results and report under ``out``; each a local folder (the single-node
default, under ``runs/``), a folder every node mounts, or a URI such as ``s3://bucket/optw``
(``$OPTW_STORAGE`` moves both). The catalog is a folder or a URI, mirrored on each node that
reads it (:mod:`optw.distributed.mirror`).

The plan is resolved once, before any training: each model's TrainConfig
(:meth:`~optw.distributed.profile.JobProfile.config_for`, refused at once when an epoch of it
cannot fit in this machine's memory) and each pack's way of training
(:func:`optw.distributed.plan.packs`) travel to the worker as frozen specs. A pack that fails
on a setting (an error naming it, raised in its worker) fails once, in one line: it is never
restarted; Ray Train restarts a worker that died (``[resources] max_failures``).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from optw import paths
from optw.catalog import CATALOG_VERSION, Catalog, open_catalog
from optw.distributed import storage as st
from optw.distributed.mirror import local_catalog, push_baselines
from optw.distributed.plan import Member, PackSpec, Unit, packs, plan, select_regions
from optw.distributed.preflight import Setting, check_cluster, check_worker_fits, worker_slots
from optw.distributed.profile import JobProfile
from optw.errors import OptwError


class PacksFailedError(OptwError, RuntimeError):
    """Packs of a stage failed: one line each, naming the pack and what failed."""


@dataclass
class JobContext:
    """Everything a unit needs, picklable for Ray tasks."""

    job: Any  # optw.tracking.JobRun of the parent run
    job_name: str
    tracking_uri: str
    catalog_dir: str  # a folder (the same on every node) or a URI
    storage: str  # Ray Train storage: a folder or a URI
    models_dir: str  # a folder or a URI
    profile: JobProfile
    config_hash: str
    use_gpu: bool
    #: extra training callbacks per unit key (picklable; e.g. a test's fault injection)
    callbacks: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    #: custom Ray resources each region worker asks for besides its CPUs (and GPU share)
    worker_resources: dict[str, float] = field(default_factory=dict)
    #: the demonstrations the models learn from: a Ray object reference to
    #: ``{(seed, score kind): {region: Demonstrations}}`` (:func:`_demonstrations`), or None
    demos: Any = None

    def demos_for(self, config: Any) -> dict[str, Any] | None:
        """The demonstrations of ``config``'s regions (None when it asks for none)."""
        if not config.demos or self.demos is None:
            return None
        import numpy as np
        import ray

        have = ray.get(self.demos)[(config.seed, config.score_kind)]
        return {r: have[r].take(np.arange(config.demos)) for r in config.regions}


@dataclass
class JobSummary:
    job_name: str
    parent_run_id: str
    tracking_uri: str
    regions: list[str]
    trained: list[str]
    skipped: list[str]
    results_path: Path | str | None  # a local path, or the URI in remote storage
    tables: dict[str, Any]
    seconds: float
    registered: dict[str, int] = field(default_factory=dict)
    report: Path | str | None = None
    #: where the time went (seconds): ils, report and the job's wall clock; and, summed over
    #: models (they run side by side), startup, training, evaluation, logging
    timings: dict[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------------------- one pack


def run_pack(pack: PackSpec, ctx: JobContext, inits: dict[str, str | None],
             ) -> dict[str, dict[str, Any]]:
    """Train a pack of models (one Ray Train worker trains them, as the plan decided), then
    evaluate, log and register each; one MLflow child run per model. Runs on any node: the
    catalog, models and storage are reached through their locations."""
    import hashlib

    import ray

    from optw.baselines.demos import DEMO_FILE
    from optw.distributed.ray_train import WorkerPack, WorkerSpec, fit_pack
    from optw.tracking import end_run, log_demonstrations

    profile, mode = ctx.profile, ctx.profile.job.mode
    units = pack.units
    specs = []
    for member in pack.members:
        unit, config = member.unit, member.config
        run_id = ctx.job.child(unit.stage, unit.key, config={
            "train": config.to_dict(), "evaluate": asdict(profile.evaluate), "mode": mode,
            "init_from": unit.init_from or "", "catalog_version": CATALOG_VERSION,
            "pack": pack.keys}, tags={"mode": mode, "profile": profile.profile})
        demos = ctx.demos_for(config)
        if demos:
            log_demonstrations(run_id, demos, st.join(ctx.catalog_dir, "baselines", DEMO_FILE),
                               ctx.tracking_uri)
        specs.append(WorkerSpec.build(config, unit.key, unit.stage, catalog=ctx.catalog_dir,
                                      tracking_uri=ctx.tracking_uri, run_id=run_id,
                                      init=inits.get(unit.key),
                                      callbacks=ctx.callbacks.get(unit.key, ()), demos=demos))
    keys = "+".join(u.key for u in units)
    tag = units[0].key if len(units) == 1 else (
        f"{units[0].key}-pack{len(units)}-{hashlib.sha1(keys.encode()).hexdigest()[:8]}")
    name = f"{ctx.job_name}-{ctx.config_hash}-{units[0].stage}-{tag}"
    outs = {u.key: st.join(ctx.models_dir, f"{u.stage}-{u.key}.pt") for u in units}
    try:
        fitted = fit_pack(WorkerPack(tuple(specs), pack.batched), ctx.storage, name,
                          profile.resources, ctx.use_gpu, outs,
                          worker_resources=ctx.worker_resources)
    except BaseException:
        for spec in specs:
            end_run(spec.run_id, "FAILED", ctx.tracking_uri)
        raise
    share = {"startup_seconds": fitted.startup_seconds / len(units),
             "train_seconds": fitted.train_seconds / len(units)}
    # every member's evaluation is a Ray task of its own: they run side by side, each asking
    # for what a training worker asks (at most one CPU: evaluation runs on one thread)
    evaluate = ray.remote(num_cpus=min(1.0, profile.resources.cpus_per_region),
                          max_retries=1)(evaluate_anywhere)
    t_eval = time.perf_counter()
    refs = {u.key: evaluate.remote(fitted.models[u.key], u.eval_regions, u.method,
                                   profile.evaluate, ctx.catalog_dir)
            for u in units if u.eval_regions}
    try:
        evals = dict(zip(refs, ray.get(list(refs.values())), strict=True))
    except BaseException:
        for spec in specs:
            end_run(spec.run_id, "FAILED", ctx.tracking_uri)
        raise
    share["eval_seconds"] = (time.perf_counter() - t_eval) / len(units)
    regions = open_catalog(local_catalog(ctx.catalog_dir))  # a URI: this node's mirror
    done: dict[str, dict[str, Any]] = {}
    for member, spec in zip(pack.members, specs, strict=True):
        u = member.unit
        region = regions.region(u.key) if u.key in regions.regions_table.index else None
        with st.local_file(fitted.models[u.key]) as local:  # remote storage: a download
            done[u.key] = {**_finish_unit(u, spec.run_id, fitted.models[u.key], local,
                                          member.config, ctx, evals.get(u.key, ([], [])),
                                          region), **share}
    return done


def evaluate_anywhere(model: str, regions: list[str], method: str, settings: Any,
                      catalog: str) -> tuple[list, list]:
    """:func:`optw.evaluate.protocol.evaluate_model` on whichever node Ray picks: a model or
    catalog given by URI is fetched to this node first."""
    from optw.evaluate.protocol import evaluate_model

    with st.local_file(model) as path:
        return evaluate_model(str(path), regions, method, settings, local_catalog(catalog))


def _finish_unit(unit: Unit, run_id: str, checkpoint: str, local: Path, config: Any,
                 ctx: JobContext, evaluation: tuple[list, list],
                 region: Any = None) -> dict[str, Any]:
    """Log one trained model's evaluation rows and beam sweep, and register the model (with
    ``region``'s data bundled, from the job's catalog); ends its MLflow run. ``checkpoint``
    is the model's location, ``local`` a local copy of it."""
    from optw.evaluate.protocol import validation_score
    from optw.tracking import (
        end_run,
        log_evaluation,
        log_file,
        log_tables,
        register_version,
        set_tags,
    )

    profile = ctx.profile
    rows, sweep = evaluation
    t0 = time.perf_counter()
    try:
        log_file(run_id, local, "checkpoints", uri=ctx.tracking_uri)
        if rows:
            import pandas as pd

            log_evaluation(run_id, pd.DataFrame(rows), f"evaluation_{unit.key}",
                           uri=ctx.tracking_uri)
            if sweep:
                log_tables(run_id, {"beam_sweep": pd.DataFrame(sweep)}, uri=ctx.tracking_uri)
        version = None
        val_score = validation_score(rows, unit.key, unit.method)
        if unit.register:
            version = register_version(unit.key, local, run_id, tags={
                "mode": profile.job.mode, "profile": profile.profile, "epochs": config.epochs,
                "val_score": val_score, "config_hash": ctx.config_hash,
                "catalog_version": CATALOG_VERSION, "job": ctx.job_name,
            }, uri=ctx.tracking_uri, region_data=region)
        set_tags(run_id, {"val_score": val_score, "version": version or ""}, ctx.tracking_uri)
        end_run(run_id, "FINISHED", ctx.tracking_uri)
    except BaseException:
        end_run(run_id, "FAILED", ctx.tracking_uri)
        raise
    return {"key": unit.key, "stage": unit.stage, "checkpoint": checkpoint, "rows": rows,
            "sweep": sweep, "version": version, "val_score": val_score, "run_id": run_id,
            "log_seconds": time.perf_counter() - t0}


# ----------------------------------------------------------------------------- the job


def _capacity(profile: JobProfile, use_gpu: bool, worker_resources: dict[str, float]) -> int:
    """Region workers the cluster holds at once: what each asks for (its CPUs, GPU share and
    custom resources), node by node."""
    need = {"CPU": profile.resources.cpus_per_region, **worker_resources}
    if use_gpu:
        need["GPU"] = profile.resources.gpu_fraction
    return worker_slots(need)


def _skip_done(stages: list[list[Member]], config_hash: str,
               uri: str) -> tuple[list[list[Member]], list[str]]:
    """Drop registering models whose champion came from the same config and catalog, and the
    global models no remaining one starts from (idempotent re-runs)."""
    from optw.tracking import find_champion_with

    skipped = [m.unit.key for s in stages for m in s if m.unit.register
               and find_champion_with(m.unit.key, config_hash, CATALOG_VERSION, uri=uri)]
    left = [[m for m in s if m.unit.key not in skipped] for s in stages]
    needed = {m.unit.init_from for s in left for m in s if m.unit.init_from}
    left = [[m for m in s if m.unit.register or m.unit.key in needed] for s in left]
    return left, skipped


def check_memory(stages: list[list[Member]], profile: JobProfile, catalog: Catalog) -> None:
    """Refuse a planned model an epoch of which cannot fit in this machine's memory
    (:func:`optw.train.config.check_fits`, on its largest training region), before anything
    starts; the error names the profile's table and ``batch_size`` / ``tourists_per_epoch``."""
    from optw.train.config import check_fits

    nodes = catalog.regions_table["nodes"]
    for stage in stages:
        for m in stage:
            check_fits(m.config, int(nodes.loc[m.config.regions].max()),
                       profile.table_of(m.unit))


def open_job_catalog(location: str | Path | None) -> tuple[str, Catalog]:
    """The catalog a job or a sweep reads: its location (``location``, a folder or a URI;
    default ``$OPTW_CATALOG`` or ``region_catalog/``) and the catalog opened on this node (a
    URI: this node's mirror)."""
    where = st.normalize(location or paths.catalog_location())
    return where, open_catalog(local_catalog(where))


#: The settings that choose each location, as errors name them.
STORAGE_SETTING = "--storage (or OPTW_STORAGE)"
OUT_SETTING = "--out (or OPTW_STORAGE)"
CATALOG_SETTING = "--catalog (or OPTW_CATALOG)"


def run_job(
    profile: JobProfile,
    *,
    catalog_dir: str | Path | None = None,
    tracking_uri: str | None = None,
    storage: str | Path | None = None,
    out_dir: str | Path | None = None,
    force: bool = False,
    progress: bool = True,
    ray_address: str | None = None,
    callbacks: dict[str, Sequence[Any]] | None = None,
    worker_resources: dict[str, float] | None = None,
) -> JobSummary:
    """Run the job described by ``profile`` on the current (or a new local) Ray cluster.

    ``catalog_dir``, ``storage`` (Ray Train's) and ``out_dir`` (models, results, report) are
    folders or URIs (defaults: ``$OPTW_CATALOG`` or ``region_catalog/``; ``$OPTW_STORAGE`` or
    ``runs/``, with ``ray_train/`` and ``<job>/`` under it; with ``out_dir`` alone, Ray Train
    keeps its checkpoints in ``<out_dir>/ray_train``). ``callbacks``: extra training callbacks
    for the models of some unit keys (regions). ``worker_resources``: custom Ray resources
    every region worker asks for (e.g. ``{"trainer": 1}``)."""
    import pandas as pd
    import ray

    from optw.baselines import load_ils_results, run_ils_baseline
    from optw.distributed.rayenv import connect, warm_train_coordinator
    from optw.tracking import check_tracking_uri, log_tables, start_job_run

    t0 = time.perf_counter()
    # -- everything that can be wrong fails here, before any training (and before anything is
    # created: a bad --address is refused in seconds)
    catalog_loc, catalog = open_job_catalog(catalog_dir)
    selected = select_regions(catalog, profile.job.groups, profile.job.regions)
    # -- the plan, resolved once: each model's TrainConfig (typed, checked), and whether an
    # epoch of it fits in memory
    stages = [[Member(u, profile.config_for(u)) for u in s]
              for s in plan(profile.job.mode, catalog, selected, profile.job.from_groups)]
    check_memory(stages, profile, catalog)
    uri = check_tracking_uri(tracking_uri)
    name = profile.job.name
    out = st.normalize(out_dir) if out_dir else paths.job_output(name)
    # with --out everything the job writes goes there, Ray Train's checkpoints included
    storage = st.normalize(storage) if storage else (st.join(out, "ray_train") if out_dir
                                                     else paths.train_storage())
    folders = [(OUT_SETTING, out), (STORAGE_SETTING, storage)]
    st.check_folders(folders)
    if not ray.is_initialized():
        connect(ray_address)  # a bad --address: refused in seconds, nothing created yet
    use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    check_worker_fits(profile.resources.cpus_per_region,
                      profile.resources.gpu_fraction if use_gpu else None,
                      where=f"{profile.profile} [resources]")
    st.prepare_folders(folders)
    # -- on a cluster of several nodes every node must reach all of it (else: refused here)
    nodes = check_cluster(
        [Setting(STORAGE_SETTING, storage), Setting(OUT_SETTING, out),
         Setting(CATALOG_SETTING, catalog_loc)], uri,
        stage_catalogs={catalog_loc: str(catalog.path)} if st.is_uri(catalog_loc) else None)
    if nodes > 1:
        from optw.tracking import check_artifact_location, experiment_id

        experiment_id(name, uri)  # the server decides where a new experiment's artifacts go
        check_artifact_location(uri, name, nodes)
    warm_train_coordinator()  # up by the first Ray Train run (after ILS)
    extra = {k: float(v) for k, v in (worker_resources or {}).items()}
    capacity = _capacity(profile, use_gpu, extra)
    where = f"{nodes} nodes, " if nodes > 1 else ""
    _say(progress, f"job {name}: mode {profile.job.mode}, {len(selected)} regions, "
         f"{sum(len(s) for s in stages)} models, {capacity} at a time "
         f"({where}{'GPU' if use_gpu else 'CPU'}); tracking {uri}; storage {st.shown(storage)}")

    # -- ILS baseline for the tourists evaluated (incremental: stored results are reused)
    eval_regions = sorted({r for s in stages for m in s for r in m.unit.eval_regions})
    if eval_regions:
        t_ils = time.perf_counter()
        # each task mirrors a catalog URI on its own node (one that joined after the check too)
        run_ils_baseline(catalog.path, regions=eval_regions, tourists="all", progress=progress,
                         task_catalog=catalog_loc, localize=local_catalog)
        push_baselines(catalog.path, catalog_loc)  # a catalog URI gets the new results
        timings = {"ils": time.perf_counter() - t_ils}
    else:
        timings = {"ils": 0.0}

    config_hash = profile.config_hash()
    skipped: list[str] = []
    if not force:
        stages, skipped = _skip_done(stages, config_hash, uri)
        if skipped:
            more = "…" if len(skipped) > 8 else ""
            _say(progress, f"{len(skipped)} region(s) already have a champion from this config "
                 f"and catalog: skipped ({', '.join(skipped[:8])}{more})")
    if not any(stages):
        return _nothing_to_do(name, uri, out, selected, skipped, time.perf_counter() - t0)
    t_demos = time.perf_counter()
    demos = _demonstrations(stages, catalog, catalog_loc, progress)
    if demos:
        push_baselines(catalog.path, catalog_loc)  # a catalog URI gets them too
        timings["demos"] = time.perf_counter() - t_demos
    job = start_job_run(name, profile.to_dict(), tags={
        "mode": profile.job.mode, "profile": profile.profile, "config_hash": config_hash,
        "catalog_version": CATALOG_VERSION, "regions": len(selected)}, uri=uri)
    ctx = JobContext(job, name, uri, catalog_loc, storage, st.join(out, "models"), profile,
                     config_hash, use_gpu, {k: tuple(v) for k, v in (callbacks or {}).items()},
                     extra, ray.put(demos) if demos else None)
    remote = ray.remote(num_cpus=0, max_retries=0)(run_pack)
    results: dict[str, dict[str, Any]] = {}
    trained: list[str] = []
    try:
        for stage in stages:
            results.update(_run_stage(remote, stage, ctx, results, capacity, progress))
            trained += [m.unit.key for m in stage]
        rows = [row for r in results.values() for row in r["rows"]]
        results_path, tables = None, {}
        if rows:
            df = pd.DataFrame(rows)
            results_path = st.join(out, "results.parquet")
            with tempfile.TemporaryDirectory(prefix="optw-results-") as tmp:
                df.to_parquet(Path(tmp) / "results.parquet")
                st.put_file(Path(tmp) / "results.parquet", results_path)  # never half-written
            tables = _tables(df, catalog, load_ils_results(catalog.path))
            sweep = [row for r in results.values() for row in r.get("sweep", [])]
            if sweep:
                tables["beam_sweep"] = pd.DataFrame(sweep)
            log_tables(job.run_id, tables, uri=uri)
        job.finish("FINISHED")
    except BaseException as exc:
        job.finish("KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
    # after finish(), so the report shows the run's final status and end time
    t_report = time.perf_counter()
    report = _report(job.run_id, out, uri, progress)
    timings["report"] = time.perf_counter() - t_report
    for part, key in (("startup", "startup_seconds"), ("training", "train_seconds"),
                      ("evaluation", "eval_seconds"), ("logging", "log_seconds")):
        timings[part] = sum(r.get(key, 0.0) for r in results.values())
    timings["wall"] = time.perf_counter() - t0
    registered = {r["key"]: r["version"] for r in results.values() if r.get("version")}
    return JobSummary(name, job.run_id, uri, selected, trained, skipped,
                      _shown(results_path), tables, time.perf_counter() - t0, registered,
                      report, timings)


def _demonstrations(stages: list[list[Member]], catalog: Any, catalog_loc: str,
                    progress: bool) -> dict[tuple[int, str | None], dict[str, Any]]:
    """The demonstrations the planned models learn from, per (seed, score kind): the stored
    ones, the missing ones computed in Ray tasks (each mirrors a catalog URI on its node)
    and stored in the catalog (:func:`optw.baselines.demos.get_demos`)."""
    import os

    from optw.baselines.demos import get_demos

    need: dict[tuple[int, str | None], dict[str, int]] = {}
    for stage in stages:
        for m in stage:
            c = m.config
            if c.demos:
                regions = need.setdefault((c.seed, c.score_kind), {})
                for r in c.regions:
                    regions[r] = max(regions.get(r, 0), c.demos)
    return {(seed, kind): get_demos(catalog, sorted(regions), max(regions.values()), seed, kind,
                                    workers=max(2, os.cpu_count() or 1), progress=progress,
                                    task_catalog=catalog_loc, localize=local_catalog)
            for (seed, kind), regions in need.items()}


def _shown(location: str | None) -> Path | str | None:
    """A location as the summary shows it: a local ``Path``, or the URI (credentials in its
    query, if any, as ``***``)."""
    if location is None:
        return None
    return st.local_path(location) or st.shown(location)


def _nothing_to_do(name: str, uri: str, out: str, selected: list[str], skipped: list[str],
                   seconds: float) -> JobSummary:
    """Every region is current: no new parent run, and the earlier results, report and
    parent run stay what the summary points at."""
    from optw.report import find_parent_run

    try:
        parent = find_parent_run(name, uri)
    except (KeyError, LookupError):
        parent = ""
    report, results_path = st.join(out, "report", "index.html"), st.join(out, "results.parquet")
    return JobSummary(name, parent, uri, selected, [], skipped,
                      _shown(results_path) if st.exists(results_path) else None, {}, seconds,
                      {}, _shown(report) if st.exists(report) else None)


def _run_stage(remote, members: list[Member], ctx: JobContext, done: dict[str, dict[str, Any]],
               capacity: int, progress: bool) -> dict[str, dict[str, Any]]:
    """Run the stage's packs (planned by :func:`optw.distributed.plan.packs`) with at most
    ``capacity`` in flight; a failed pack fails the job at the end of the stage (the others
    finish and are kept)."""
    import ray

    bar = None
    if progress and members:
        from tqdm import tqdm

        bar = tqdm(total=len(members), desc=f"stage {members[0].unit.stage}", unit="model")
    resources = ctx.profile.resources
    pending = packs(members, resources.regions_per_worker, capacity, resources.pack_mode)
    in_flight: dict[Any, PackSpec] = {}
    results: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    while pending or in_flight:
        while pending and len(in_flight) < capacity:
            pack = pending.pop(0)
            inits = {u.key: done[u.init_from]["checkpoint"] if u.init_from else None
                     for u in pack.units}
            in_flight[remote.remote(pack, ctx, inits)] = pack
        ready, _ = ray.wait(list(in_flight), num_returns=1)
        for ref in ready:
            pack = in_flight.pop(ref)
            try:
                results.update(ray.get(ref))
            except Exception as exc:  # noqa: BLE001 - reported with the pack's names
                errors.append(f"{pack.units[0].stage} {'+'.join(pack.keys)}: {failure(exc)}")
            if bar is not None:
                bar.update(len(pack))
                bar.set_postfix_str(pack.keys[-1])
    if bar is not None:
        bar.close()
    if errors:
        raise PacksFailedError(f"{len(errors)} pack(s) failed:\n  " + "\n  ".join(errors))
    return results


def failure(exc: BaseException) -> str:
    """One line of a pack's failure: an error meant for the user (a setting, raised in its
    worker) as it is, since it names the setting; any other as its type and first line (Ray's
    traceback stays in its log folder)."""
    from ray.exceptions import RayTaskError

    while isinstance(exc, RayTaskError) and isinstance(exc.cause, BaseException):
        exc = exc.cause
    workers = getattr(exc, "worker_failures", None)  # Ray Train: the failed workers' errors
    if isinstance(workers, dict) and workers:
        exc = next(iter(workers.values()))
    if isinstance(exc, OptwError):
        return " ".join(str(exc).split())
    return f"{type(exc).__name__}: {st.first_line(exc)}"


def _tables(df, catalog, ils) -> dict[str, Any]:
    from optw.evaluate import evaluate, load_best_known, validate_results

    clean = validate_results(df.drop(columns=["kind"]), catalog, check_routes=False)
    try:
        best = load_best_known()
    except (FileNotFoundError, OSError, ValueError):
        best = None
    if best is not None and not set(clean["region"]) <= set(best.index):
        best = None  # regions outside the benchmark set (custom catalogs) have no best-known
    return evaluate(clean, ils, best)


def _report(run_id: str, out: str, uri: str, progress: bool) -> Path | str | None:
    """The HTML report of the job in ``<out>/report``, logged to the parent run (a failure
    here only warns); remote storage gets a copy of the folder written here."""
    from optw.report import write_and_log_report

    try:
        local = st.local_path(out)
        if local is not None:
            return write_and_log_report(run_id, local / "report", uri)
        with tempfile.TemporaryDirectory(prefix="optw-report-") as tmp:
            index = write_and_log_report(run_id, Path(tmp) / "report", uri)
            st.upload_dir(index.parent, st.join(out, "report"))
            return st.join(out, "report", index.name)
    except Exception as exc:  # noqa: BLE001 - the models and tables are already safe
        _say(progress, f"warning: the HTML report could not be written: {exc}")
        return None


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(msg, flush=True)
