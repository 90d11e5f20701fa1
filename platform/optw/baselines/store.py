"""Stored ILS results: Parquet files beside the catalog, filled incrementally and in parallel.

Layout (git-ignored), one row per (region, tourist): ``region, tourist, kind, score, route
(list<int32>), seconds, iterations, ils_version``, in two stores that never mix:
``<catalog>/baselines/ils.parquet`` for our tourists (benchmark id 0, validation 1..64) and
``<catalog>/baselines/ils_paper.parquet`` for the paper's sets (ids 1000..1063). Each file's
metadata records the hash of the catalog file its tourists come from (``tourists.parquet``,
``paper_tourists.parquet``); rows from another ILS version or another build of those tourists
are stale and are recomputed.

Every write merges with the file as it is on disk, writes a temporary file beside it and
``os.replace``-s it in, so a reader never sees a partial store. Work runs as one Ray task per
(region, kind) batch on a local cluster (``workers`` CPUs), or in-process with ``workers=1``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from optw.baselines.ils import ILS_VERSION, MAX_ITER_NO_IMPROVE
from optw.catalog.store import CatalogError, write_parquet_atomic
from optw.errors import UserError
from optw.raylocal import ensure_token

ILS_FILE = "ils.parquet"
PAPER_ILS_FILE = "ils_paper.parquet"
#: Tourist kinds the ILS can be run on (``all`` = every one the catalog holds).
TOURIST_KINDS = ("benchmark", "validation", "paper")
#: kind -> its store; store -> the catalog file its tourists come from
_STORE_OF = {"benchmark": ILS_FILE, "validation": ILS_FILE, "paper": PAPER_ILS_FILE}
_SOURCE_OF = {ILS_FILE: "tourists.parquet", PAPER_ILS_FILE: "paper_tourists.parquet"}
COLUMNS = ("region", "tourist", "kind", "score", "route", "seconds", "iterations", "ils_version")
_META_KEY = b"optw.catalog_tourists_sha256"
SCHEMA = pa.schema([
    ("region", pa.string()), ("tourist", pa.int64()), ("kind", pa.string()),
    ("score", pa.float64()), ("route", pa.list_(pa.int32())), ("seconds", pa.float64()),
    ("iterations", pa.int64()), ("ils_version", pa.int64()),
])


def ils_store_path(catalog_dir: Path | str | None = None, kind: str = "validation") -> Path:
    """The store of ``kind``'s results: ``<catalog>/baselines/ils.parquet`` (benchmark and
    validation) or ``ils_paper.parquet`` (paper); default catalog: ``$OPTW_CATALOG`` or
    ``region_catalog/``."""
    return _store_path(catalog_dir, _STORE_OF[kind])


def _store_path(catalog_dir: Path | str | None, store: str) -> Path:
    from optw.catalog.store import default_catalog_dir

    return Path(catalog_dir or default_catalog_dir()) / "baselines" / store


def _catalog_hash(catalog_dir: Path | str | None, store: str = ILS_FILE) -> str | None:
    """Hash of the catalog file the store's tourists come from (None: the catalog has none)."""
    from optw.catalog.store import open_catalog

    return open_catalog(catalog_dir).manifest["files"].get(_SOURCE_OF[store])


def _empty() -> pd.DataFrame:
    return SCHEMA.empty_table().to_pandas()


def _read(path: Path) -> tuple[pd.DataFrame, str | None]:
    if not path.exists():
        return _empty(), None
    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    sha = meta.get(_META_KEY)
    return table.to_pandas(), sha.decode() if sha else None


def load_ils_results(
    catalog_dir: Path | str | None = None, current_only: bool = True
) -> pd.DataFrame:
    """Stored ILS results as a DataFrame (columns :data:`COLUMNS`; empty if none stored).

    Both stores are read (our tourists and the paper's sets; their tourist ids never
    overlap). With ``current_only`` (default) rows computed by another ILS version or for
    another build of the catalog's tourists are left out.
    """
    parts = []
    for store in _SOURCE_OF:
        df, sha = _read(_store_path(catalog_dir, store))
        if current_only and len(df):
            if sha is None or sha != _catalog_hash(catalog_dir, store):
                continue
            df = df[df["ils_version"] == ILS_VERSION]
        if len(df):
            parts.append(df)
    if not parts:
        return _empty()
    df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    return df.sort_values(["region", "tourist"]).reset_index(drop=True)


def write_ils_results(
    catalog_dir: Path | str | None, rows: pd.DataFrame, replace_stale: bool = True
) -> Path:
    """Merge ``rows`` into their stores by kind (new rows win per (region, tourist)); atomic
    replace. Returns the path of the last store written."""
    path = ils_store_path(catalog_dir)
    for store, part in rows.groupby(rows["kind"].map(_STORE_OF), sort=False):
        path = _write_store(catalog_dir, part, str(store), replace_stale)
    return path


def _write_store(catalog_dir: Path | str | None, rows: pd.DataFrame, store: str,
                 replace_stale: bool) -> Path:
    path = _store_path(catalog_dir, store)
    sha = _catalog_hash(catalog_dir, store)
    if sha is None:
        raise CatalogError(f"the catalog at {catalog_dir} has no {_SOURCE_OF[store]} to store "
                         "ILS results for")
    old, old_sha = _read(path)
    if replace_stale and old_sha != sha:
        old = _empty()
    df = pd.concat([old, rows[list(COLUMNS)]], ignore_index=True) if len(old) else rows
    df = df.drop_duplicates(["region", "tourist"], keep="last")
    df = df.sort_values(["region", "tourist"]).reset_index(drop=True)
    df["route"] = [np.asarray(r, dtype=np.int32) for r in df["route"]]
    table = pa.Table.from_pandas(df[list(COLUMNS)], schema=SCHEMA, preserve_index=False)
    table = table.replace_schema_metadata({_META_KEY: sha.encode()})
    return write_parquet_atomic(table, path)


# ----------------------------------------------------------------------------- work


_CATALOGS: dict[tuple[str, int], object] = {}
#: How a task turns the catalog location it was given into a folder on its own node (e.g.
#: :func:`optw.distributed.mirror.local_catalog`, which mirrors a URI there).
Localize = Callable[[str], str]


def _task_catalog(catalog: str, localize: Localize | None):
    """The catalog a task opens: ``catalog`` made local by ``localize`` on this node first
    (cached per process and per build, so a mirror brought up to date is opened again)."""
    from optw.catalog.store import open_catalog

    folder = localize(catalog) if localize is not None else catalog
    manifest = Path(folder) / "manifest.json"
    key = (str(folder), manifest.stat().st_mtime_ns if manifest.is_file() else 0)
    cat = _CATALOGS.get(key)
    if cat is None:
        cat = _CATALOGS[key] = open_catalog(folder)
    return cat


def solve_region_batch(catalog_dir: str, region_id: str, kind: str, tourist_ids: list[int],
                       max_iter_no_improve: int = MAX_ITER_NO_IMPROVE, *,
                       localize: Localize | None = None) -> list[dict]:
    """Solve the listed tourists of one region (a Ray task; the catalog is cached per process).

    ``catalog_dir`` is the catalog's location as this task's node can open it, or, with
    ``localize``, a location that ``localize`` turns into a folder on this node (a catalog URI
    mirrored on entry, so a node that joined the cluster after the job's check gets it too).
    Every route is checked with :func:`optw.env.validate.check_route`.
    """
    from optw.baselines.ils import solve_ils
    from optw.env.validate import check_route

    cat = _task_catalog(catalog_dir, localize)
    region = cat.region(region_id)
    batch = cat.tourists(region_id, kind)
    pos = {int(t): i for i, t in enumerate(batch.tourist_id)}
    out = []
    for tid in tourist_ids:
        i = pos[int(tid)]
        res = solve_ils(region, batch, i, max_iter_no_improve)
        chk = check_route(region, res.route, batch, i, claimed_score=res.score)
        if not chk.ok:
            raise RuntimeError(f"ILS produced an invalid route for {region_id} tourist {tid}: "
                               + "; ".join(chk.problems))
        out.append({"region": region_id, "tourist": int(tid), "kind": kind,
                    "score": res.score, "route": res.route, "seconds": res.seconds,
                    "iterations": res.iterations, "ils_version": ILS_VERSION})
    return out


@dataclass
class IlsRun:
    """What :func:`run_ils_baseline` did: the selected rows, how many were computed, timing."""

    results: pd.DataFrame
    computed: int
    cached: int
    seconds: float
    path: Path
    new_keys: set = field(default_factory=set)
    #: every store the selection's results live in (``path`` is the first)
    paths: list[Path] = field(default_factory=list)


def _selection(cat, regions, groups, kinds) -> list[tuple[str, str, list[int]]]:
    ids = cat.list_regions(groups) if groups else cat.list_regions()
    if regions:
        for r in regions:
            cat.region(r)  # KeyError naming the region, with a suggestion
        wanted = set(regions)
        ids = [r for r in ids if r in wanted]
    return [(rid, kind, [int(t) for t in cat.tourists(rid, kind).tourist_id])
            for rid in ids for kind in kinds]


def run_ils_baseline(
    catalog_dir: Path | str | None = None,
    regions: Iterable[str] | None = None,
    groups: Iterable[str] | None = None,
    tourists: str = "all",
    workers: int | None = None,
    progress: bool = True,
    force: bool = False,
    on_result: Callable[[dict], None] | None = None,
    flush_seconds: float = 30.0,
    task_catalog: str | None = None,
    localize: Localize | None = None,
    task_resources: Mapping[str, float] | None = None,
) -> IlsRun:
    """Compute the ILS results missing from the store for the selection, in parallel.

    ``tourists`` is ``benchmark``, ``validation``, ``paper`` or ``all`` (every kind the
    catalog holds: the paper's sets only in a catalog built with ``--paper-sets``); ``force``
    recomputes stored pairs. ``on_result`` is called with each new row as it arrives. Progress
    is flushed to the stores every ``flush_seconds`` and at the end (also when interrupted).

    On a cluster the Ray tasks open ``task_catalog`` (default: ``catalog_dir``, a folder every
    node must see at that path) through ``localize`` on their own node (picklable; e.g.
    :func:`optw.distributed.mirror.local_catalog` with the catalog's URI), and each asks for
    the custom Ray resources ``task_resources``. The results are written by this process into
    ``catalog_dir``'s stores.
    """
    from optw.catalog.store import default_catalog_dir, open_catalog

    t0 = time.perf_counter()
    catalog_dir = Path(catalog_dir or default_catalog_dir()).resolve()
    cat = open_catalog(catalog_dir)
    if tourists not in (*TOURIST_KINDS, "all"):
        raise UserError(f"--tourists: unknown tourist kind {tourists!r}; expected "
                         f"{', '.join(TOURIST_KINDS)} or all")
    if tourists == "paper" and not cat.has_paper_sets:
        raise CatalogError(f"--tourists paper: the catalog at {catalog_dir} has no paper sets; "
                           f"build them with `optw catalog build --paper-sets --out "
                           f"{catalog_dir}`")
    kinds = (tuple(k for k in TOURIST_KINDS if k != "paper" or cat.has_paper_sets)
             if tourists == "all" else (tourists,))
    groups = list(groups) if groups else None
    selection = _selection(cat, list(regions) if regions else None, groups, kinds)
    if not selection:
        raise UserError(f"no region matches --regions {list(regions or [])} within "
                         f"--groups {groups}")
    stored = pd.DataFrame() if force else load_ils_results(catalog_dir)
    done = set(zip(stored["region"], stored["tourist"], strict=True)) if len(stored) else set()
    jobs = []
    for rid, kind, tids in selection:
        todo = [t for t in tids if (rid, t) not in done]
        if todo:
            jobs.append((cat.regions_table.at[rid, "nodes"] * len(todo), rid, kind, todo))
    jobs.sort(key=lambda j: -j[0])  # longest first balances the workers
    n_todo = sum(len(j[3]) for j in jobs)
    workers = max(1, int(workers or os.cpu_count() or 1))

    new_rows: list[dict] = []
    pending_flush: list[dict] = []
    last_flush = time.perf_counter()

    def flush() -> None:
        nonlocal pending_flush, last_flush
        if pending_flush:
            write_ils_results(catalog_dir, pd.DataFrame(pending_flush))
            pending_flush = []
        last_flush = time.perf_counter()

    def accept(rows: list[dict]) -> None:
        new_rows.extend(rows)
        pending_flush.extend(rows)
        if on_result is not None:
            for row in rows:
                on_result(row)
        if time.perf_counter() - last_flush >= flush_seconds:
            flush()

    bar = None
    if progress and n_todo:
        from tqdm import tqdm

        bar = tqdm(total=n_todo, desc="ILS", unit="tourist", smoothing=0.05)
    try:
        if jobs:
            from optw.baselines.ils import warm_up

            warm_up()  # compile once here, so workers load the numba cache
            if workers == 1:
                for _, rid, kind, todo in jobs:
                    rows = solve_region_batch(str(catalog_dir), rid, kind, todo)
                    accept(rows)
                    if bar is not None:
                        bar.update(len(rows))
            else:
                _run_ray(jobs, task_catalog or str(catalog_dir), workers, accept, bar,
                         localize, dict(task_resources or {}))
    finally:
        flush()
        if bar is not None:
            bar.close()

    keys = {(rid, t) for rid, _, tids in selection for t in tids}
    final = load_ils_results(catalog_dir)
    mask = [(r, t) in keys for r, t in zip(final["region"], final["tourist"], strict=True)]
    paths = list(dict.fromkeys(ils_store_path(catalog_dir, k) for k in kinds))
    return IlsRun(
        results=final[mask].reset_index(drop=True), computed=len(new_rows),
        cached=len(keys) - len(new_rows), seconds=time.perf_counter() - t0,
        path=paths[0], new_keys={(r["region"], r["tourist"]) for r in new_rows}, paths=paths,
    )


def _run_ray(jobs, catalog_dir: str, workers: int, accept, bar,
             localize: Localize | None = None, resources: dict[str, float] | None = None,
             ) -> None:
    """One Ray task per job on the current cluster (else a local one of ``workers`` CPUs);
    each task opens ``catalog_dir`` through ``localize`` on its own node."""
    import ray

    started = False
    if not ray.is_initialized():
        ensure_token()
        ray.init(
            address="local", num_cpus=workers, include_dashboard=False,
            object_store_memory=200 * 1024**2, log_to_driver=True,
            configure_logging=True, logging_level="ERROR",
        )
        started = True
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(solve_region_batch)
        if resources:
            task = task.options(resources=resources)
        pending = {task.remote(catalog_dir, rid, kind, todo, localize=localize): len(todo)
                   for _, rid, kind, todo in jobs}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                pending.pop(ref)
                rows = ray.get(ref)
                accept(rows)
                if bar is not None:
                    bar.update(len(rows))
    finally:
        if started:
            ray.shutdown()
