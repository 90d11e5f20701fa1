"""Stored ILS results (docs/ils.md), filled incrementally and in parallel; a store's metadata
holds the hash of its tourists' catalog file: rows of another ILS version or build are stale."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from optw.baselines.ils import ILS_VERSION, solve_ils, warm_up
from optw.catalog.store import (
    TOURIST_KINDS,
    CatalogError,
    default_catalog_dir,
    open_catalog,
    write_parquet_atomic,
)
from optw.env.validate import check_route
from optw.errors import UserError
from optw.raylocal import ensure_token

ILS_FILE = "ils.parquet"
PAPER_ILS_FILE = "ils_paper.parquet"
#: kind -> its store; store -> the catalog file its tourists come from
_STORE_OF = {"benchmark": ILS_FILE, "validation": ILS_FILE, "paper": PAPER_ILS_FILE}
_SOURCE_OF = {ILS_FILE: "tourists.parquet", PAPER_ILS_FILE: "paper_tourists.parquet"}
_META_KEY = b"optw.catalog_tourists_sha256"
SCHEMA = pa.schema([
    ("region", pa.string()), ("tourist", pa.int64()), ("kind", pa.string()),
    ("score", pa.float64()), ("route", pa.list_(pa.int32())), ("seconds", pa.float64()),
    ("iterations", pa.int64()), ("ils_version", pa.int64()),
])


def ils_store_path(catalog_dir: Path | str | None = None, kind: str = "validation") -> Path:
    """The store of ``kind``'s results (default: the default catalog's)."""
    return _store_path(catalog_dir, _STORE_OF[kind])


def _store_path(catalog_dir: Path | str | None, store: str) -> Path:
    return Path(catalog_dir or default_catalog_dir()) / "baselines" / store


def _catalog_hash(catalog_dir: Path | str | None, store: str) -> str | None:
    """Hash of the catalog file the store's tourists come from (None: the catalog has none)."""
    return open_catalog(catalog_dir).manifest["files"].get(_SOURCE_OF[store])


def _read(path: Path) -> tuple[pd.DataFrame, str | None]:
    if not path.exists():
        return SCHEMA.empty_table().to_pandas(), None
    table = pq.read_table(path)
    sha = (table.schema.metadata or {}).get(_META_KEY)
    return table.to_pandas(), sha.decode() if sha else None


def load_ils_results(catalog_dir: Path | str | None = None) -> pd.DataFrame:
    """The current (not stale) stored ILS results of both stores, by region and tourist."""
    parts = []
    for store in _SOURCE_OF:
        df, sha = _read(_store_path(catalog_dir, store))
        if sha is not None and sha == _catalog_hash(catalog_dir, store):
            parts.append(df[df["ils_version"] == ILS_VERSION])
    if not (parts := [df for df in parts if len(df)]):
        return SCHEMA.empty_table().to_pandas()
    df = pd.concat(parts, ignore_index=True)
    return df.sort_values(["region", "tourist"]).reset_index(drop=True)


def write_ils_results(catalog_dir: Path | str | None, rows: pd.DataFrame) -> Path:
    """Merge ``rows`` into their stores (new rows win); returns the last store written."""
    path = ils_store_path(catalog_dir)
    for store, part in rows.groupby(rows["kind"].map(_STORE_OF), sort=False):
        path = _store_path(catalog_dir, store)
        sha = _catalog_hash(catalog_dir, store)
        if sha is None:
            raise CatalogError(f"the catalog at {catalog_dir} has no {_SOURCE_OF[store]} to "
                               "store ILS results for")
        old, old_sha = _read(path)
        df = pd.concat([old, part], ignore_index=True) if len(old) and old_sha == sha else part
        df = df.drop_duplicates(["region", "tourist"], keep="last")
        df = df.sort_values(["region", "tourist"]).reset_index(drop=True)
        df["route"] = [np.asarray(r, dtype=np.int32) for r in df["route"]]
        table = pa.Table.from_pandas(df[SCHEMA.names], schema=SCHEMA, preserve_index=False)
        write_parquet_atomic(table.replace_schema_metadata({_META_KEY: sha.encode()}), path)
    return path


#: The catalogs a process's tasks opened, by folder and build (manifest time).
_CATALOGS: dict[tuple[str, int], object] = {}
#: How a task turns the catalog location it was given into a folder on its own node.
Localize = Callable[[str], str]


def solve_region_batch(catalog_dir: str, region_id: str, kind: str, tourist_ids: list[int],
                       *, localize: Localize | None = None) -> list[dict]:
    """Store rows of the listed tourists of one region, each route checked (a Ray task)."""
    folder = localize(catalog_dir) if localize is not None else catalog_dir
    manifest = Path(folder) / "manifest.json"
    key = (str(folder), manifest.stat().st_mtime_ns if manifest.is_file() else 0)
    if key not in _CATALOGS:  # a mirror brought up to date is opened again
        _CATALOGS[key] = open_catalog(folder)
    cat = _CATALOGS[key]
    region = cat.region(region_id)
    batch = cat.tourists(region_id, kind)
    pos = {int(t): i for i, t in enumerate(batch.tourist_id)}
    out = []
    for tid in tourist_ids:
        i = pos[int(tid)]
        res = solve_ils(region, batch, i)
        check_route(region, res.route, batch, i, claimed_score=res.score).raise_if_invalid(
            f"the ILS route of {region_id} tourist {tid}")
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
    new_keys: set[tuple[str, int]]
    #: every store the selection's results live in
    paths: list[Path]


def run_ils_baseline(catalog_dir: Path | str | None = None,
                     regions: Iterable[str] | None = None, groups: Iterable[str] | None = None,
                     tourists: str = "all", workers: int | None = None, progress: bool = True,
                     force: bool = False, on_result: Callable[[dict], None] | None = None,
                     flush_seconds: float = 30.0, task_catalog: str | None = None,
                     localize: Localize | None = None,
                     task_resources: Mapping[str, float] | None = None) -> IlsRun:
    """Compute the ILS results missing from the store for the selection, in parallel (Ray tasks
    open ``task_catalog`` through ``localize``); new rows are flushed every ``flush_seconds``."""
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
    regions = list(regions or [])
    groups = list(groups) if groups else None
    ids = [r for r in cat.list_regions(groups) if not regions or r in regions]
    for r in regions:
        cat.region(r)  # an unknown region is an error naming it, with a suggestion
    selection = [(rid, kind, [int(t) for t in cat.tourists(rid, kind).tourist_id])
                 for rid in ids for kind in kinds]
    if not selection:
        raise UserError(f"no region matches --regions {regions} within --groups {groups}")
    stored = pd.DataFrame() if force else load_ils_results(catalog_dir)
    done = set(zip(stored["region"], stored["tourist"], strict=True)) if len(stored) else set()
    where = task_catalog or str(catalog_dir)
    jobs = []  # the calls of solve_region_batch
    for rid, kind, tids in selection:
        if todo := [t for t in tids if (rid, t) not in done]:
            jobs.append((where, rid, kind, todo))
    # longest first (nodes × tourists), so that the workers finish together
    jobs.sort(key=lambda j: -cat.regions_table.at[j[1], "nodes"] * len(j[3]))
    n_todo = sum(len(j[3]) for j in jobs)
    workers = max(1, int(workers or os.cpu_count() or 1))

    new_rows: list[dict] = []
    flushed, last_flush = 0, time.perf_counter()  # new_rows[:flushed] are in the stores

    def flush() -> None:
        nonlocal flushed, last_flush
        if flushed < len(new_rows):
            write_ils_results(catalog_dir, pd.DataFrame(new_rows[flushed:]))
            flushed = len(new_rows)
        last_flush = time.perf_counter()

    with tqdm(total=n_todo, desc="ILS", unit="tourist", smoothing=0.05,
              disable=not (progress and n_todo)) as bar:
        try:
            if jobs:
                warm_up()  # compile once here, so workers load the numba cache
                for rows in map_tasks(solve_region_batch, jobs, workers, task_resources,
                                      localize=localize):
                    new_rows.extend(rows)
                    for row in rows if on_result is not None else ():
                        on_result(row)
                    bar.update(len(rows))
                    if time.perf_counter() - last_flush >= flush_seconds:
                        flush()
        finally:
            flush()

    keys = {(rid, t) for rid, _, tids in selection for t in tids}
    final = load_ils_results(catalog_dir)
    mask = [(r, t) in keys for r, t in zip(final["region"], final["tourist"], strict=True)]
    return IlsRun(
        results=final[mask].reset_index(drop=True), computed=len(new_rows),
        cached=len(keys) - len(new_rows), seconds=time.perf_counter() - t0,
        new_keys={(r["region"], r["tourist"]) for r in new_rows},
        paths=list(dict.fromkeys(ils_store_path(catalog_dir, k) for k in kinds)),
    )


def map_tasks(fn: Callable[..., Any], calls: list[tuple], workers: int,
              resources: Mapping[str, float] | None = None, **kwargs: Any) -> Iterator[Any]:
    """``fn(*call, **kwargs)`` of each call as they finish, in-process or as Ray tasks."""
    if workers <= 1:
        for call in calls:
            yield fn(*call, **kwargs)
        return
    import ray

    started = not ray.is_initialized()  # a local cluster of our own, shut down at the end
    if started:
        ensure_token()
        ray.init(address="local", num_cpus=workers, include_dashboard=False,
                 object_store_memory=200 * 1024**2, configure_logging=True,
                 logging_level="ERROR")
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(fn)
        if resources:
            task = task.options(resources=dict(resources))
        pending = [task.remote(*call, **kwargs) for call in calls]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            yield ray.get(ready[0])
    finally:
        if started:
            ray.shutdown()
