"""The platform job (:func:`run_job`): ILS, one Ray Train run per pack, evaluation, MLflow."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from optw import paths
from optw.catalog import CATALOG_VERSION, Catalog, open_catalog
from optw.distributed import preflight as pf
from optw.distributed import storage as st
from optw.distributed.mirror import local_catalog, push_baselines
from optw.distributed.plan import (
    RELEASE_PREFIX,
    Member,
    PackSpec,
    packs,
    plan,
    release_key,
    select_regions,
)
from optw.distributed.profile import JobProfile
from optw.errors import OptwError

#: The kind of a job's output folder (:mod:`optw.outdir`: marker ``.optw-job``, naming the
#: job) and what a job writes there.
OUT_KIND = "job"
OUT_ENTRIES = frozenset({"results.parquet", "models", "report", "ray_train"})
#: Seconds an interrupted or failed job waits for the packs it cancels to stop.
STOP_WAIT_S = 15.0


class PacksFailedError(OptwError, RuntimeError):
    """Packs of a stage failed: one line each, naming the pack and what failed."""


@dataclass
class JobContext:
    """Everything a unit needs, picklable for Ray tasks."""

    job: Any  # optw.tracking.JobRun of the parent run
    tracking_uri: str
    catalog_dir: str  # locations: folders (the same on every node) or URIs
    storage: str  # Ray Train's
    models_dir: str
    profile: JobProfile
    config_hash: str
    use_gpu: bool
    callbacks: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # extra, per unit key
    worker_resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources
    demos: Any = None  # a Ray object reference to :func:`_demonstrations`, or None
    releases: dict[str, str] = field(default_factory=dict)  # group -> release_label(...)

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
    trained: list[str]
    skipped: list[str]
    results_path: Path | str | None  # a local path, or a URI
    tables: dict[str, Any]
    seconds: float
    registered: dict[str, int] = field(default_factory=dict)
    report: Path | str | None = None
    #: seconds: ils, demos, report, wall; summed over models: startup, training, evaluation, logging
    timings: dict[str, float] = field(default_factory=dict)
    releases: dict[str, str] = field(default_factory=dict)  # group -> release_label(...)


def job_releases(profile: JobProfile) -> dict[str, dict[str, Any]]:
    """The manifests of the releases a ``[job] releases = true`` job may start from (each
    weights file checked against its manifest's sha256), by group."""
    from optw.model.release import checked_release, release_groups

    if not profile.job.releases:
        return {}
    return {g: checked_release(g)[1] for g in release_groups()}


def release_label(manifest: dict[str, Any]) -> str:
    """``gavalas v2 (sha256 1a2b3c4d5e6f)``: a release as tags and the summary name it."""
    return f"{manifest['group']} v{manifest['version']} (sha256 {manifest['sha256'][:12]})"


def run_pack(pack: PackSpec, ctx: JobContext, inits: dict[str, str | None],
             ) -> dict[str, dict[str, Any]]:
    """Train a pack in one Ray Train worker, then evaluate, log and register each model."""
    import ray

    from optw.baselines.demos import DEMO_FILE
    from optw.distributed.ray_train import WorkerPack, WorkerSpec, fit_pack
    from optw.tracking import end_run, log_demonstrations

    profile, mode, units = ctx.profile, ctx.profile.job.mode, pack.units
    specs = []
    for member in pack.members:
        unit, config = member.unit, member.config
        release = ctx.releases.get((unit.init_from or "").removeprefix(RELEASE_PREFIX))
        run_id = ctx.job.child(unit.stage, unit.key, config={
            "train": config.to_dict(), "evaluate": asdict(profile.evaluate), "mode": mode,
            "init_from": unit.init_from or "", "catalog_version": CATALOG_VERSION,
            "pack": pack.keys}, tags={"mode": mode, "profile": profile.profile,
                                      **({"release": release} if release else {})})
        if demos := ctx.demos_for(config):
            log_demonstrations(run_id, demos, st.join(ctx.catalog_dir, "baselines", DEMO_FILE),
                               ctx.tracking_uri)
        specs.append(WorkerSpec.build(
            config, unit.key, unit.stage, catalog=ctx.catalog_dir, tracking_uri=ctx.tracking_uri,
            run_id=run_id, init=inits.get(unit.key), callbacks=ctx.callbacks.get(unit.key, ()),
            demos=demos))
    digest = hashlib.sha1("+".join(pack.keys).encode()).hexdigest()[:8]
    tag = units[0].key if len(units) == 1 else f"{units[0].key}-pack{len(units)}-{digest}"
    name = f"{profile.job.name}-{ctx.config_hash}-{units[0].stage}-{tag}"
    outs = {u.key: st.join(ctx.models_dir, f"{u.stage}-{u.key}.pt") for u in units}
    # each member's evaluation is a Ray task of its own (at most one CPU: it runs on one thread)
    evaluate = ray.remote(num_cpus=min(1.0, profile.resources.cpus_per_region),
                          max_retries=1)(evaluate_anywhere)
    try:
        startup, training = fit_pack(WorkerPack(tuple(specs), pack.batched), ctx.storage, name,
                                     profile.resources, ctx.use_gpu, outs, ctx.worker_resources)
        t_eval = time.perf_counter()
        refs = {u.key: evaluate.remote(outs[u.key], u.eval_regions, u.method, profile.evaluate,
                                       ctx.catalog_dir) for u in units if u.eval_regions}
        evals = dict(zip(refs, ray.get(list(refs.values())), strict=True))
    except BaseException:
        for spec in specs:
            end_run(spec.run_id, "FAILED", ctx.tracking_uri)
        raise
    share = {"startup": startup / len(units), "training": training / len(units),
             "evaluation": (time.perf_counter() - t_eval) / len(units)}  # seconds
    catalog = open_catalog(local_catalog(ctx.catalog_dir))  # a URI: this node's mirror
    return {m.unit.key: {**_finish_unit(m, spec.run_id, outs[m.unit.key], ctx,
                                        evals.get(m.unit.key, ([], [])), catalog), **share}
            for m, spec in zip(pack.members, specs, strict=True)}


def evaluate_anywhere(model: str, regions: list[str], method: str, settings: Any,
                      catalog: str) -> tuple[list, list]:
    """:func:`optw.evaluate.protocol.evaluate_model` on any node (locations made local)."""
    from optw.evaluate.protocol import evaluate_model

    with st.local_file(model) as path:
        return evaluate_model(str(path), regions, method, settings, local_catalog(catalog))


def _finish_unit(member: Member, run_id: str, checkpoint: str, ctx: JobContext,
                 evaluation: tuple[list, list], catalog: Catalog) -> dict[str, Any]:
    """Log a trained model and its evaluation, register it and end its MLflow run."""
    import pandas as pd

    from optw import tracking
    from optw.evaluate.protocol import validation_score

    unit, profile, uri = member.unit, ctx.profile, ctx.tracking_uri
    rows, sweep = evaluation
    t0 = time.perf_counter()
    try:
        with st.local_file(checkpoint) as local:  # a URI: a download
            tracking.log_file(run_id, local, "checkpoints", uri=uri)
            if rows:
                tracking.log_evaluation(run_id, pd.DataFrame(rows), f"evaluation_{unit.key}",
                                        uri=uri)
                if sweep:
                    tracking.log_tables(run_id, {"beam_sweep": pd.DataFrame(sweep)}, uri=uri)
            version = None
            val_score = validation_score(rows, unit.key, unit.method)
            if unit.register:
                region = (catalog.region(unit.key) if unit.key in catalog.regions_table.index
                          else None)
                release = ctx.releases.get((unit.init_from or "").removeprefix(RELEASE_PREFIX))
                version = tracking.register_version(unit.key, local, run_id, tags={
                    "mode": profile.job.mode, "profile": profile.profile,
                    "epochs": member.config.epochs, "val_score": val_score,
                    "config_hash": ctx.config_hash, "catalog_version": CATALOG_VERSION,
                    "job": profile.job.name, **({"release": release} if release else {})},
                    uri=uri, region_data=region)
        tracking.set_tags(run_id, {"val_score": val_score, "version": version or ""}, uri)
        tracking.end_run(run_id, "FINISHED", uri)
    except BaseException:
        tracking.end_run(run_id, "FAILED", uri)
        raise
    return {"key": unit.key, "stage": unit.stage, "checkpoint": checkpoint, "rows": rows,
            "sweep": sweep, "version": version, "val_score": val_score, "run_id": run_id,
            "logging": time.perf_counter() - t0}


def _skip_done(stages: list[list[Member]], config_hash: str,
               uri: str) -> tuple[list[list[Member]], list[str]]:
    """Drop models current in the registry (same config, catalog) and globals none needs."""
    from optw.tracking import find_champion_with

    skipped = [m.unit.key for s in stages for m in s if m.unit.register
               and find_champion_with(m.unit.key, config_hash, CATALOG_VERSION, uri=uri)]
    left = [[m for m in s if m.unit.key not in skipped] for s in stages]
    needed = {m.unit.init_from for s in left for m in s if m.unit.init_from}
    left = [[m for m in s if m.unit.register or m.unit.key in needed] for s in left]
    return left, skipped


def job_out_dir(out: str, name: str, option: str | None) -> Path | None:
    """The local folder ``out`` when job ``name`` may write there (new, empty, its own or a
    job folder from before markers; else an :class:`~optw.outdir.OutDirError`); a URI: None,
    unchecked."""
    from optw.outdir import check_out_dir

    local = st.local_path(out)
    return None if local is None else check_out_dir(local, OUT_KIND, OUT_ENTRIES, option, name)


def open_job_catalog(location: str | Path | None) -> tuple[str, Catalog]:
    """A catalog location (default ``$OPTW_CATALOG``...) and the catalog open on this node."""
    where = st.normalize(location or paths.catalog_location())
    return where, open_catalog(local_catalog(where))


@dataclass
class JobPlan:
    """What a job's preflight settled, before anything ran: where everything goes, the
    cluster, and the stages of models with their start models."""

    name: str
    out: str  # models, results, report: a folder or a URI
    storage: str  # Ray Train's
    catalog_loc: str
    catalog: Catalog
    selected: list[str]
    stages: list[list[Member]]
    releases: dict[str, str]  # group -> release_label(...) of the releases the job starts from
    config_hash: str
    tracking_uri: str
    use_gpu: bool
    capacity: int  # region workers at a time
    worker_resources: dict[str, float]


def run_job(profile: JobProfile, *, catalog_dir: str | Path | None = None,
            tracking_uri: str | None = None, storage: str | Path | None = None,
            out_dir: str | Path | None = None, force: bool = False, progress: bool = True,
            ray_address: str | None = None, callbacks: dict[str, Sequence[Any]] | None = None,
            worker_resources: dict[str, float] | None = None) -> JobSummary:
    """Run the job described by ``profile`` on the current (or a new local) Ray cluster.
    ``catalog_dir``, ``storage`` and ``out_dir`` are folders or URIs (defaults: ``$OPTW_CATALOG``
    or ``region_catalog/``; ``ray_train/`` and ``<job>/`` under ``$OPTW_STORAGE`` or ``runs/``).
    The stages: preflight, baselines, models (skipping current ones), results, report."""
    import ray

    from optw.tracking import start_job_run

    t0 = time.perf_counter()
    jp = preflight(profile, catalog_dir, tracking_uri, storage, out_dir, ray_address,
                   worker_resources, progress)
    timings = {"ils": baselines(jp, progress)}
    stages, skipped = jp.stages, []
    if not force:
        stages, skipped = _skip_done(stages, jp.config_hash, jp.tracking_uri)
        if skipped:
            more = "…" if len(skipped) > 8 else ""
            _say(progress, f"{len(skipped)} region(s) already have a champion from this config "
                 f"and catalog: skipped ({', '.join(skipped[:8])}{more})")
    if not any(stages):  # every region is current: the summary points at the earlier run
        from optw.report import find_parent_run

        parent = ""
        with contextlib.suppress(LookupError):
            parent = find_parent_run(jp.name, jp.tracking_uri)
        return JobSummary(jp.name, parent, jp.tracking_uri, [], skipped,
                          _shown(st.join(jp.out, "results.parquet")), {},
                          time.perf_counter() - t0, {},
                          _shown(st.join(jp.out, "report", "index.html")), releases=jp.releases)
    t_demos = time.perf_counter()
    if demos := _demonstrations(stages, jp.catalog, jp.catalog_loc, progress):
        push_baselines(jp.catalog.path, jp.catalog_loc)  # a catalog URI gets them too
        timings["demos"] = time.perf_counter() - t_demos
    job = start_job_run(jp.name, profile.to_dict(), tags={
        "mode": profile.job.mode, "profile": profile.profile, "config_hash": jp.config_hash,
        "catalog_version": CATALOG_VERSION, "regions": len(jp.selected),
        **({"releases": "; ".join(jp.releases.values())} if jp.releases else {})},
        uri=jp.tracking_uri)
    ctx = JobContext(job, jp.tracking_uri, jp.catalog_loc, jp.storage, st.join(jp.out, "models"),
                     profile, jp.config_hash, jp.use_gpu,
                     {k: tuple(v) for k, v in (callbacks or {}).items()}, jp.worker_resources,
                     ray.put(demos) if demos else None, jp.releases)
    try:
        results = PackScheduler(stages, ctx, jp.capacity, progress).run()
        results_path, tables = write_results(results, jp, job.run_id)
        job.finish("FINISHED")
    except BaseException as exc:
        job.finish("KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
    # after finish(), so the report shows the run's final status and end time
    t_report = time.perf_counter()
    report = _report(job.run_id, jp.out, jp.tracking_uri, progress)
    timings["report"] = time.perf_counter() - t_report
    for part in ("startup", "training", "evaluation", "logging"):
        timings[part] = sum(r.get(part, 0.0) for r in results.values())
    timings["wall"] = time.perf_counter() - t0
    registered = {r["key"]: r["version"] for r in results.values() if r.get("version")}
    trained = [m.unit.key for s in stages for m in s]
    return JobSummary(jp.name, job.run_id, jp.tracking_uri, trained, skipped,
                      _shown(results_path), tables, time.perf_counter() - t0, registered, report,
                      timings, jp.releases)


def preflight(profile: JobProfile, catalog_dir: str | Path | None, tracking_uri: str | None,
              storage: str | Path | None, out_dir: str | Path | None, ray_address: str | None,
              worker_resources: dict[str, float] | None, progress: bool) -> JobPlan:
    """Everything that can be wrong fails here, before anything trains or is created: the out
    folder, the catalog and regions, the releases, each model's memory, the tracking store,
    then Ray's cluster (devices, worker size, locations every node reaches)."""
    from optw.distributed.rayenv import warm_train_coordinator
    from optw.outdir import write_marker
    from optw.tracking import check_tracking_uri
    from optw.train.config import check_fits

    name = profile.job.name
    out = st.normalize(out_dir) if out_dir else paths.job_output(name)
    local_out = job_out_dir(out, name, "--out" if out_dir else None)  # never another's folder
    catalog_loc, catalog = open_job_catalog(catalog_dir)
    selected = select_regions(catalog, profile.job.groups, profile.job.regions)
    manifests = job_releases(profile)
    stages = [[Member(u, profile.config_for(u)) for u in s]
              for s in plan(profile.job.mode, catalog, selected, profile.job.from_groups,
                            list(manifests))]
    used = sorted({m.unit.init_from.removeprefix(RELEASE_PREFIX) for s in stages for m in s
                   if (m.unit.init_from or "").startswith(RELEASE_PREFIX)})
    sizes = catalog.regions_table["nodes"]
    for m in (m for s in stages for m in s):  # an epoch on its largest region must fit
        check_fits(m.config, int(sizes.loc[m.config.regions].max()), profile.table_of(m.unit))
    uri = check_tracking_uri(tracking_uri)
    # with --out everything the job writes goes there, Ray Train's checkpoints included
    storage = st.normalize(storage) if storage else (st.join(out, "ray_train") if out_dir
                                                     else paths.train_storage())
    folders = [pf.Setting("--storage (or OPTW_STORAGE)", storage),
               pf.Setting("--out (or OPTW_STORAGE)", out)]
    st.prepare_folders(folders, create=False)  # created once Ray is up
    nodes, use_gpu = pf.join_cluster(folders, pf.Setting(pf.CATALOG_SETTING, catalog_loc),
                                     catalog.path, uri, profile, ray_address)
    if local_out is not None:  # created just now: the job's own
        write_marker(local_out, OUT_KIND, OUT_ENTRIES, name=name)
    if nodes > 1:
        from optw.tracking import check_artifact_location, experiment_id

        experiment_id(name, uri)  # the server decides where a new experiment's artifacts go
        check_artifact_location(uri, name, nodes)
    warm_train_coordinator()  # up by the first Ray Train run (after ILS)
    extra = {k: float(v) for k, v in (worker_resources or {}).items()}
    capacity = pf.worker_slots(pf.worker_need(profile.resources, use_gpu, extra))
    where = f"{nodes} nodes, " if nodes > 1 else ""
    _say(progress, f"job {name}: mode {profile.job.mode}, {len(selected)} regions, "
         f"{sum(len(s) for s in stages)} models, {capacity} at a time "
         f"({where}{'GPU' if use_gpu else 'CPU'}); tracking {uri}; storage {st.shown(storage)}")
    return JobPlan(name, out, storage, catalog_loc, catalog, selected, stages,
                   {g: release_label(manifests[g]) for g in used},
                   profile.config_hash({g: manifests[g]["sha256"] for g in used}), uri, use_gpu,
                   capacity, extra)


def baselines(jp: JobPlan, progress: bool) -> float:
    """The ILS results the evaluation compares with, computed where missing (Ray tasks, each
    mirroring a catalog URI on its own node); returns the seconds it took."""
    from optw.baselines import run_ils_baseline

    t0 = time.perf_counter()
    regions = sorted({r for s in jp.stages for m in s for r in m.unit.eval_regions})
    if regions:
        run_ils_baseline(jp.catalog.path, regions=regions, tourists="all", progress=progress,
                         task_catalog=jp.catalog_loc, localize=local_catalog)
        push_baselines(jp.catalog.path, jp.catalog_loc)  # a catalog URI gets the new results
    return time.perf_counter() - t0


def write_results(results: dict[str, dict[str, Any]], jp: JobPlan, run_id: str,
                  ) -> tuple[str | None, dict[str, Any]]:
    """The evaluation rows of every model as ``results.parquet`` (written whole) and the
    paper's tables, logged to the parent run."""
    import pandas as pd

    from optw.tracking import log_tables

    rows = [row for r in results.values() for row in r["rows"]]
    if not rows:
        return None, {}
    df = pd.DataFrame(rows)
    path = st.join(jp.out, "results.parquet")
    st.write_bytes(path, df.to_parquet())  # whole: never half-written
    tables = _tables(df, jp.catalog)
    if sweep := [row for r in results.values() for row in r["sweep"]]:
        tables["beam_sweep"] = pd.DataFrame(sweep)
    log_tables(run_id, tables, uri=jp.tracking_uri)
    return path, tables


def _demonstrations(stages: list[list[Member]], catalog: Any, catalog_loc: str,
                    progress: bool) -> dict[tuple[int, str | None], dict[str, Any]]:
    """``{(seed, score kind): {region: Demonstrations}}`` the planned models learn from."""
    from optw.baselines.demos import get_demos

    need: dict[tuple[int, str | None], tuple[set[str], int]] = {}  # regions, most demos
    for c in (m.config for s in stages for m in s if m.config.demos):
        regions, most = need.get((c.seed, c.score_kind), (set(), 0))
        need[(c.seed, c.score_kind)] = (regions | set(c.regions), max(most, c.demos))
    return {(seed, kind): get_demos(catalog, sorted(regions), most, seed, kind,
                                    workers=max(2, os.cpu_count() or 1), progress=progress,
                                    task_catalog=catalog_loc, localize=local_catalog)
            for (seed, kind), (regions, most) in need.items()}


def _shown(location: str | None) -> Path | str | None:
    """A file as the summary shows it (a local ``Path`` or the URI), None if it is not there."""
    if location is None or not st.exists(location):
        return None
    return st.local_path(location) or st.shown(location)


class PackScheduler:
    """Runs a job's stages of packs on Ray: at most ``capacity`` in flight, each once the
    models it starts from are done (a release is done from the start); a later stage's pack
    starts during an earlier one only on a free core (a global model's time cap is wall clock).
    A failed pack fails the job once the others are done; an interrupt cancels those in
    flight."""

    def __init__(self, stages: list[list[Member]], ctx: JobContext, capacity: int,
                 progress: bool):
        import ray
        from tqdm import tqdm

        self.ctx, self.capacity = ctx, capacity
        self.remote = ray.remote(num_cpus=0, max_retries=0)(run_pack)
        resources = ctx.profile.resources
        self.pending = [p for stage in stages for p in packs(
            stage, resources.regions_per_worker, capacity, resources.pack_mode)]
        self.left = {s[0].unit.stage: len(s) for s in stages if s}  # models left per stage
        self.order = {name: i for i, name in enumerate(self.left)}
        self.bars = {name: tqdm(total=n, desc=f"stage {name}", unit="model",
                                disable=not progress) for name, n in self.left.items()}
        self.in_flight: dict[Any, PackSpec] = {}
        # a release is a finished start model (resolved where it trains: train_worker)
        self.results: dict[str, dict[str, Any]] = {
            release_key(g): {"key": release_key(g), "stage": "release",
                             "checkpoint": release_key(g), "rows": [], "sweep": []}
            for g in ctx.releases}
        self.failed: set[str] = set()
        self.errors: list[str] = []
        self.cores = ray.cluster_resources().get("CPU", capacity)

    def run(self) -> dict[str, dict[str, Any]]:
        """Every pack's results by model key (a :class:`PacksFailedError` if any failed)."""
        try:
            while self.pending or self.in_flight:
                self._drop_orphans()
                while len(self.in_flight) < self.capacity and (
                        pack := next(filter(self._ready, self.pending), None)):
                    self._launch(pack)
                if not self.in_flight:
                    if self.pending:  # cannot happen: the plan starts models from planned ones
                        raise RuntimeError(f"packs {[p.keys for p in self.pending]} start from "
                                           "models that are not planned")
                    break
                self._collect_one()
        except BaseException:  # interrupted or failed: no pack goes on training and logging
            _stop(list(self.in_flight))
            raise
        finally:
            for bar in self.bars.values():
                bar.close()
        if self.errors:
            raise PacksFailedError(f"{len(self.errors)} pack(s) failed:\n  "
                                   + "\n  ".join(self.errors))
        return self.results

    @staticmethod
    def _threads(pack: PackSpec) -> int:
        return pack.members[0].config.threads or 1

    def _ready(self, pack: PackSpec) -> bool:
        earlier_left = any(self.left[s] for s in self.left
                           if self.order[s] < self.order[pack.units[0].stage])
        busy = sum(self._threads(p) for p in self.in_flight.values())
        return all(u.init_from is None or u.init_from in self.results for u in pack.units) and (
            not earlier_left or busy + self._threads(pack) <= self.cores)

    def _launch(self, pack: PackSpec) -> None:
        self.pending.remove(pack)
        inits = {u.key: self.results[u.init_from]["checkpoint"] if u.init_from else None
                 for u in pack.units}
        self.in_flight[self.remote.remote(pack, self.ctx, inits)] = pack

    def _drop_orphans(self) -> None:
        """Packs whose start model failed are failed without running."""
        for pack in [p for p in self.pending if any(u.init_from in self.failed
                                                    for u in p.units)]:
            self.pending.remove(pack)
            self._done(pack)
            self._fail(pack, "not run (the model it starts from failed)")

    def _collect_one(self) -> None:
        import ray

        (ref,), _ = ray.wait(list(self.in_flight), num_returns=1)
        pack = self.in_flight.pop(ref)
        try:
            self.results.update(ray.get(ref))
        except Exception as exc:  # noqa: BLE001 - reported with the pack's names
            self._fail(pack, failure(exc))
        bar = self.bars[pack.units[0].stage]
        bar.update(len(pack))
        bar.set_postfix_str(pack.keys[-1])
        self._done(pack)

    def _done(self, pack: PackSpec) -> None:
        stage = pack.units[0].stage
        self.left[stage] -= len(pack)
        if not self.left[stage]:
            self.bars[stage].close()

    def _fail(self, pack: PackSpec, why: str) -> None:
        self.failed.update(pack.keys)
        self.errors.append(f"{pack.units[0].stage} {'+'.join(pack.keys)}: {why}")


def _stop(refs: list[Any]) -> None:
    """Cancel the packs in flight (their Ray Train runs end with them) and wait a little."""
    import ray

    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)
    with contextlib.suppress(Exception):
        ray.wait(refs, num_returns=len(refs), timeout=STOP_WAIT_S)


def failure(exc: BaseException) -> str:
    """One line of a pack's failure: an OptwError as it is, else its type and first line."""
    from ray.exceptions import RayTaskError

    while isinstance(exc, RayTaskError) and isinstance(exc.cause, BaseException):
        exc = exc.cause
    workers = getattr(exc, "worker_failures", None)  # Ray Train: the failed workers' errors
    if isinstance(workers, dict) and workers:
        exc = next(iter(workers.values()))
    if isinstance(exc, OptwError):
        return " ".join(str(exc).split())
    return f"{type(exc).__name__}: {st.first_line(exc)}"


def _tables(df, catalog) -> dict[str, Any]:
    from optw.baselines import load_ils_results
    from optw.evaluate import evaluate, load_best_known, validate_results

    clean = validate_results(df.drop(columns=["kind"]), catalog, check_routes=False)
    best = None
    with contextlib.suppress(OSError, ValueError):
        best = load_best_known()
    if best is not None and not set(clean["region"]) <= set(best.index):
        best = None  # regions outside the benchmark set (custom catalogs) have no best-known
    return evaluate(clean, load_ils_results(catalog.path), best)


def _report(run_id: str, out: str, uri: str, progress: bool) -> Path | str | None:
    """The HTML report in ``<out>/report``, logged to the parent run (else a warning)."""
    from optw.report import write_and_log_report

    try:
        if (local := st.local_path(out)) is not None:
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
