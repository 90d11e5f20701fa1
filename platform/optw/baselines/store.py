"""Stored ILS results (docs/ils.md), filled incrementally and in parallel; a store's metadata
holds the hash of its tourists' catalog file and of each region's content: rows of another ILS
version, build or region content are stale. Every store of ``baselines/`` is read through
:func:`read_store`, which checks it."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from optw.baselines.ils import ILS_VERSION, solve_ils, warm_up
from optw.catalog.region import Region
from optw.catalog.store import (
    BASELINES_DIR,
    DEMO_FILE,
    ILS_FILE,
    ILS_TOURISTS_META,
    PAPER_ILS_FILE,
    TOURIST_KINDS,
    Catalog,
    CatalogError,
    clear_command,
    default_catalog_dir,
    open_catalog,
    write_parquet_atomic,
)
from optw.env.validate import check_route
from optw.errors import UserError
from optw.raylocal import ensure_token

#: kind -> its store; store -> the catalog file its tourists come from
_STORE_OF = {"benchmark": ILS_FILE, "validation": ILS_FILE, "paper": PAPER_ILS_FILE}
_SOURCE_OF = {ILS_FILE: "tourists.parquet", PAPER_ILS_FILE: "paper_tourists.parquet"}
_META_KEY = ILS_TOURISTS_META
#: Schema-metadata key of the ILS stores: ``{region: region_sha256}`` of the regions they hold.
_REGIONS_KEY = b"optw.region_sha256"
SCHEMA = pa.schema([
    ("region", pa.string()), ("tourist", pa.int64()), ("kind", pa.string()),
    ("score", pa.float64()), ("route", pa.list_(pa.int32())), ("seconds", pa.float64()),
    ("iterations", pa.int64()), ("ils_version", pa.int64()),
])
#: The demonstrations' store (:mod:`optw.baselines.demos`): a row per demonstration, with
#: the :func:`region_sha256` of its region.
DEMO_SCHEMA = pa.schema([
    ("region", pa.string()), ("seed", pa.int64()), ("score_kind", pa.string()),
    ("ils_version", pa.int64()), ("index", pa.int64()), ("tourist", pa.int64()),
    ("start_x", pa.float64()), ("start_y", pa.float64()), ("t_start", pa.float64()),
    ("t_end", pa.float64()), ("scores", pa.list_(pa.float64())), ("route", pa.list_(pa.int32())),
    ("score", pa.float64()), ("seconds", pa.float64()), ("region_sha256", pa.string()),
])
#: The stores of ``baselines/`` that ``optw baseline clear --store`` names.
STORES = {"ils": (ILS_FILE, PAPER_ILS_FILE), "demos": (DEMO_FILE,)}


class StoreError(UserError):
    """A store of ``<catalog>/baselines/`` that cannot be used as it is (unreadable, another
    file, a bad row); the message names the file and the command that clears it."""

    def __init__(self, path: Path, problem: str, region: str | None = None):
        super().__init__(f"{path} {problem}; clear it with `{clear_command(path, region)}` "
                         "(what it held is computed again when next needed)")
        self.path = path


def _same_kind(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Whether a column of type ``actual`` holds what ``expected`` holds (any width)."""
    if pa.types.is_list(expected):
        return ((pa.types.is_list(actual) or pa.types.is_large_list(actual))
                and _same_kind(actual.value_type, expected.value_type))
    if pa.types.is_string(expected):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual)
    for kind in (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean):
        if kind(expected):
            return kind(actual)
    return actual.equals(expected)


def read_store(path: Path, schema: pa.Schema, what: str,
               defaults: Mapping[str, Any] | None = None) -> pa.Table | None:
    """The store at ``path`` cast to ``schema`` with its metadata (None: no store yet), once its
    columns are ``schema``'s (a column of ``defaults`` may be missing: an older store's, filled
    with its default) of the same kinds without nulls; else a :class:`StoreError`."""
    if not path.exists():
        return None
    try:
        if not path.is_file():
            raise StoreError(path, "is not a file")
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        why = str(exc).splitlines()[0].split(f"'{path}': ")[-1]
        raise StoreError(path, f"cannot be read as {what} ({why})") from None
    meta, names = table.schema.metadata, set(table.column_names)
    if missing := [n for n in schema.names if n not in names and n not in (defaults or {})]:
        raise StoreError(path, f"is not {what}: it lacks column(s) {', '.join(missing)}"
                         f"{' (it holds ' + ', '.join(sorted(names)) + ')' if names else ''}")
    if extra := sorted(names - set(schema.names)):
        raise StoreError(path, f"is not {what}: it has other column(s) {', '.join(extra)}")
    for name, value in (defaults or {}).items():
        if name not in names:
            field = schema.field(name)
            table = table.append_column(field, pa.array([value] * len(table), field.type))
    wrong = [f"{f.name} is {table[f.name].type}, not {f.type}" for f in schema
             if not _same_kind(table[f.name].type, f.type)]
    if wrong:
        raise StoreError(path, f"is not {what}: {'; '.join(wrong)}")
    for f in schema:
        col = table[f.name]
        inner = pc.list_flatten(col).null_count if pa.types.is_list(f.type) else 0
        if col.null_count or inner:
            raise StoreError(path, f"has null values in column {f.name}")
    try:
        return table.select(schema.names).cast(schema).replace_schema_metadata(meta)
    except (pa.ArrowException, ValueError) as exc:
        raise StoreError(path, f"does not fit {what} ({str(exc).splitlines()[0]})") from None


def region_sha256(region: Region) -> str:
    """SHA-256 of what a region's ILS results and demonstrations depend on: its group, times, nodes
    and travel (not its id or names), so a region re-added with other points has another."""
    head = [region.group, region.n_nodes, region.t_start, region.t_end, region.decimals,
            region.coords, region.metric, region.speed_kmh, region.origin,
            region.travel is not None]
    h = hashlib.sha256(json.dumps(head).encode())
    for a in (region.x, region.y, region.duration, region.opening, region.closing,
              region.score, region.travel):
        if a is not None:
            h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return h.hexdigest()


def region_digests(cat: Catalog, region_ids: Iterable[str]) -> dict[str, str | None]:
    """:func:`region_sha256` of each region id (None: not in the catalog)."""
    return {rid: region_sha256(cat.region(rid)) if rid in cat else None for rid in set(region_ids)}


def clear_stores(catalog_dir: Path | str | None, stores: Iterable[str],
                 regions: Iterable[str] | None = None) -> list[tuple[Path, int | None]]:
    """Clear the ``stores`` (keys of :data:`STORES`) of a catalog: remove their files, or only
    the rows of ``regions`` (rewritten atomically); (file, rows removed or None: the whole
    file) of each store there was. Nothing but the stores' own files is touched."""
    folder = Path(catalog_dir or default_catalog_dir()) / BASELINES_DIR
    regions = set(regions or ())
    done: list[tuple[Path, int | None]] = []
    for path in (folder / name for store in stores for name in STORES[store]):
        if not path.is_file():
            continue
        if not regions:
            path.unlink()
            done.append((path, None))
            continue
        table = read_demos_table(path) if path.name == DEMO_FILE else _read_ils_table(path)
        kept = table.filter(pc.invert(pc.is_in(table["region"], pa.array(sorted(regions)))))
        if len(kept) < len(table):
            write_parquet_atomic(kept, path)
        done.append((path, len(table) - len(kept)))
    return done


def read_demos_table(path: Path) -> pa.Table:
    """The checked demonstrations' store at ``path`` (empty if none); an older store without
    region hashes reads as stale rows (hash "")."""
    table = read_store(path, DEMO_SCHEMA, "a demonstrations store", {"region_sha256": ""})
    return DEMO_SCHEMA.empty_table() if table is None else table


def ils_store_path(catalog_dir: Path | str | None = None, kind: str = "validation") -> Path:
    """The store of ``kind``'s results (default: the default catalog's)."""
    return _store_path(catalog_dir, _STORE_OF[kind])


def _store_path(catalog_dir: Path | str | None, store: str) -> Path:
    return Path(catalog_dir or default_catalog_dir()) / BASELINES_DIR / store


def _read_ils_table(path: Path) -> pa.Table:
    """The checked ILS store at ``path`` (empty if none): :data:`SCHEMA`, and kinds of its own."""
    if (table := read_store(path, SCHEMA, "an ILS results store")) is None:
        return SCHEMA.empty_table()
    if bad := sorted(set(table["kind"].to_pylist()) - {k for k, s in _STORE_OF.items()
                                                       if s == path.name}):
        raise StoreError(path, f"holds rows of kind {', '.join(bad)}, which belong in another "
                         "store (a file copied over it?)")
    return table


def _current(cat: Catalog, store: str) -> pd.DataFrame:
    """The current rows of an ILS store (checked): this catalog's tourists, ILS version and regions
    (a region's recorded content hash its own; none recorded: an older store, rows trusted)."""
    path = _store_path(cat.path, store)
    table = _read_ils_table(path)
    meta = table.schema.metadata or {}
    try:
        regions = json.loads(meta.get(_REGIONS_KEY, b"{}"))
    except ValueError:
        regions = None
    if not isinstance(regions, dict):
        raise StoreError(path, "has unreadable region hashes in its metadata")
    df, sha = table.to_pandas(), meta.get(_META_KEY)
    current = np.zeros(len(df), dtype=bool)
    if len(df) and sha and sha.decode() == cat.manifest["files"].get(_SOURCE_OF[store]):
        now = region_digests(cat, df["region"])
        fresh = {r: h is not None and regions.get(r, h) == h for r, h in now.items()}
        current = (df["region"].map(fresh).to_numpy(bool)
                   & (df["ils_version"] == ILS_VERSION).to_numpy())
    return df[current]


def load_ils_results(catalog_dir: Path | str | None = None) -> pd.DataFrame:
    """The current (not stale) stored ILS results of both stores, by region and tourist."""
    cat = open_catalog(catalog_dir)
    parts = [_current(cat, store) for store in _SOURCE_OF]
    if not (parts := [df for df in parts if len(df)]):
        return SCHEMA.empty_table().to_pandas()
    df = pd.concat(parts, ignore_index=True)
    return df.sort_values(["region", "tourist"]).reset_index(drop=True)


def write_ils_results(catalog_dir: Path | str | None, rows: pd.DataFrame) -> Path:
    """Merge ``rows`` into their stores (new rows win, stale ones go); returns the last written."""
    path = ils_store_path(catalog_dir)
    cat = open_catalog(catalog_dir)
    for store, part in rows.groupby(rows["kind"].map(_STORE_OF), sort=False):
        path = _store_path(catalog_dir, store)
        if (sha := cat.manifest["files"].get(_SOURCE_OF[store])) is None:  # the tourists' file
            raise CatalogError(f"the catalog at {catalog_dir} has no {_SOURCE_OF[store]} to "
                               "store ILS results for")
        old = _current(cat, store)
        df = pd.concat([old, part], ignore_index=True) if len(old) else part
        df = df.drop_duplicates(["region", "tourist"], keep="last")
        df = df.sort_values(["region", "tourist"]).reset_index(drop=True)
        df["route"] = [np.asarray(r, dtype=np.int32) for r in df["route"]]
        digests = region_digests(cat, df["region"])
        table = pa.Table.from_pandas(df[SCHEMA.names], schema=SCHEMA, preserve_index=False)
        write_parquet_atomic(table.replace_schema_metadata({
            _META_KEY: sha.encode(),
            _REGIONS_KEY: json.dumps(dict(sorted(digests.items()))).encode()}), path)
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
                           f"build them with `optw catalog build --paper-sets --out {catalog_dir}`")
    kinds = (tuple(k for k in TOURIST_KINDS if k != "paper" or cat.has_paper_sets)
             if tourists == "all" else (tourists,))
    regions = list(regions or [])
    groups = list(groups) if groups else None
    ids = [r for r in cat.list_regions(groups) if not regions or r in regions]
    for r in regions:
        cat.region(r)  # an unknown region is an error naming it, with a suggestion
    selection = [(rid, kind, [int(t) for t in cat.tourists(rid, kind).tourist_id])
                 for rid in ids for kind in kinds  # "all": no paper set for a custom region
                 if not (tourists == "all" and kind == "paper" and cat.is_custom(rid))]
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
        paths=list(dict.fromkeys(ils_store_path(catalog_dir, k) for k in kinds)))


def map_tasks(fn: Callable[..., Any], calls: list[tuple], workers: int,
              resources: Mapping[str, float] | None = None, **kwargs: Any) -> Iterator[Any]:
    """``fn(*call, **kwargs)`` of each call as they finish, in-process or as Ray tasks."""
    if workers <= 1:
        yield from (fn(*call, **kwargs) for call in calls)
        return
    import ray

    started = not ray.is_initialized()  # a local cluster of our own, shut down at the end
    if started:
        ensure_token()
        ray.init(address="local", num_cpus=workers, include_dashboard=False,
                 object_store_memory=200 * 1024**2, configure_logging=True, logging_level="ERROR")
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
