"""Build and open the region catalog (Parquet files + manifest).

Layout of a catalog folder (schema in ``region_catalog/README.md``)::

    regions.parquet   one row per region
    nodes.parquet     one row per (region, node)
    tourists.parquet  one row per (region, tourist): benchmark (id 0) + 64 validation (1..64)
    travel_times.parquet  travel-time matrices of custom regions given one (one row per node)
    custom/<region>/  the source files of each custom region (``optw catalog add``), so a
                      rebuild re-adds it (:mod:`optw.catalog.custom`)
    paper_tourists.parquet  optional (``--paper-sets``): the paper's own 64 tourists per region
                      (ids 1000..1063, flagged exact or not; :mod:`optw.catalog.paper_sets`)
    manifest.json     catalog_version, build settings, row counts and file hashes

A build writes into a temporary folder beside the target and only then moves the files in,
manifest last, so a failed build leaves the previous catalog exactly as it was. Adding or
removing a custom region (:func:`add_region`, :func:`remove_region`) works the same way and
also drops the region's stored ILS results (``baselines/``), keeping the others current.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from optw import paths
from optw.catalog.custom import (
    CUSTOM_DECIMALS,
    POINT_FILE_TYPES,
    CustomRegionError,
    build_custom_region,
    check_region_id,
)
from optw.catalog.generator import VALIDATION_SEED, VALIDATION_SIZE, validation_tourists
from optw.catalog.parse import discover, parse_file
from optw.catalog.region import (
    CUSTOM_GROUP,
    GROUPS,
    PAPER_SUBSET,
    Region,
    Tourists,
    benchmark_tourist,
)
from optw.catalog.tables import (  # noqa: F401 - read_regions, write_parquet_atomic re-exported
    NODE_ARRAYS,
    NODES_SCHEMA,
    PAPER_FILE,
    PAPER_KIND,
    REGIONS_SCHEMA,
    TOURISTS_SCHEMA,
    TRAVEL_FILE,
    TRAVEL_SCHEMA,
    read_regions,
    region_from_row,
    write_parquet_atomic,
)
from optw.errors import OptwError, UserError
from optw.outdir import OutDirError
from optw.paths import (
    PROJECT_ROOT,  # noqa: F401 - re-exported by optw.catalog
    file_sha256,
)

#: Bump whenever the schema or the meaning of a column changes.
CATALOG_VERSION = 2
FILES = ("regions.parquet", "nodes.parquet", "tourists.parquet", TRAVEL_FILE)
#: Folder (in the catalog) of the custom regions' source files, one sub-folder per region.
CUSTOM_DIR = "custom"
CUSTOM_SPEC = "region.json"
#: Schema-metadata key holding the hash of the catalog's tourist file in the ILS stores
#: (``baselines/*.parquet``, written by :mod:`optw.baselines.store`).
ILS_TOURISTS_META = b"optw.catalog_tourists_sha256"
#: Stored tourist kinds: the benchmark tourist, our validation tourists, the paper's sets.
TOURIST_KINDS = ("benchmark", "validation", PAPER_KIND)
#: Named sets of generated tourists a model is evaluated on (ours: the default).
TOURIST_SETS = ("validation", PAPER_KIND)


class CatalogError(OptwError, RuntimeError):
    """A missing, partial or out-of-date catalog."""


class UnknownRegionError(OptwError, KeyError):
    """A region id the catalog does not have (a ``KeyError``; the message names it)."""

    def __str__(self) -> str:  # KeyError's str() would quote the whole message
        return str(self.args[0]) if self.args else ""


#: What a catalog folder holds besides the marker-less tables (``optw catalog build`` writes
#: into a folder of only these, or an empty, new or built one).
CATALOG_NAMES = frozenset({"README.md", "manifest.json", *FILES, PAPER_FILE, CUSTOM_DIR,
                           "baselines"})


def check_catalog_dir(out: Path | str, option: str | None = None) -> Path:
    """``out`` resolved, when a catalog may be built there: absent, empty, a built catalog
    (``manifest.json``) or a folder holding only catalog files (:data:`CATALOG_NAMES`, e.g. the
    project's ``region_catalog/`` with its README before the first build). A file or a folder
    of other files is an :class:`~optw.outdir.OutDirError` naming it (and ``option``, e.g.
    ``--out``); nothing is touched. A build keeps the folder's ``custom/`` and ``baselines/``,
    so a catalog folder is updated in place, not replaced whole."""
    given = Path(out)
    out = given.resolve()

    def refuse(reason: str) -> OutDirError:
        return OutDirError(given, reason, option) if option else OutDirError(out, reason)

    if out.exists() and not out.is_dir():
        raise refuse("is a file, not a catalog folder; choose a new, an empty or a catalog "
                     "folder")
    if not out.is_dir():
        return out
    try:
        names = {p.name for p in out.iterdir() if not p.name.startswith(".build-")}
    except OSError as exc:
        raise refuse(f"cannot be listed ({exc.strerror or exc})") from None
    if (out / "manifest.json").is_file() or names <= CATALOG_NAMES:
        return out
    other = sorted(names - CATALOG_NAMES)
    listed = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "")
    raise refuse(f"holds other files ({listed}) and is not a catalog folder; choose a new, an "
                 "empty or a catalog folder")


def default_source() -> Path:
    """``$OPTW_BENCHMARKS``, else ``../shared/benchmarks/optw`` beside the project."""
    return paths.benchmarks_dir()


def default_catalog_dir() -> Path:
    """``$OPTW_CATALOG``, else the project's ``region_catalog/``."""
    return paths.catalog_dir()


# ----------------------------------------------------------------------------- build


def _tables(regions: list[Region], seed: int, n_val: int) -> dict[str, pa.Table]:
    reg_rows, node_cols, tour_rows = [], {k: [] for k in (
        "region", "index", "x", "y", "duration", "opening", "closing", "score",
        "name", "lat", "lon")}, []
    travel_rows = []
    for r in regions:
        reg_rows.append({
            "region": r.id, "group": r.group, "points": r.n_points, "nodes": r.n_nodes,
            "t_start": r.t_start, "t_end": r.t_end, "start_x": r.start_xy[0],
            "start_y": r.start_xy[1], "decimals": r.decimals, "t_day": r.t_day,
            "t_max": r.t_max, "s_max_benchmark": r.s_max_benchmark, "s_max": r.s_max,
            "max_duration": r.max_duration, "score_kind": r.default_score_kind,
            "paper_subset": r.id in PAPER_SUBSET, "source_file": r.source_file,
            "source_sha256": r.source_hash, "coords": r.coords, "metric": r.metric,
            "speed_kmh": r.speed_kmh, "origin_lat": r.origin[0] if r.origin else None,
            "origin_lon": r.origin[1] if r.origin else None, "start_name": r.start_name,
            "travel_matrix": r.travel is not None,
        })
        node_cols["region"] += [r.id] * r.n_nodes
        node_cols["index"].append(np.arange(r.n_nodes, dtype=np.int32))
        for k in ("x", "y", "duration", "opening", "closing", "score"):
            node_cols[k].append(getattr(r, k))
        node_cols["name"] += list(r.names) if r.names else [None] * r.n_nodes
        for k in ("lat", "lon"):
            v = getattr(r, k)
            node_cols[k] += [None] * r.n_nodes if v is None else [float(a) for a in v]
        if r.travel is not None:
            travel_rows += [{"region": r.id, "index": i, "minutes": r.travel[i].tolist()}
                            for i in range(r.n_nodes)]
        tourists = [benchmark_tourist(r), validation_tourists(r, n_val, seed)]
        for batch in tourists:
            for i in range(len(batch)):
                tour_rows.append({
                    "region": r.id, "tourist": int(batch.tourist_id[i]), "kind": batch.kind,
                    "start_x": float(batch.start_xy[i, 0]),
                    "start_y": float(batch.start_xy[i, 1]),
                    "t_start": float(batch.t_start[i]), "t_end": float(batch.t_end[i]),
                    "scores": batch.scores[i].astype(np.float64),
                })
    nodes = {k: (v if k in ("region", "name", "lat", "lon") else np.concatenate(v))
             for k, v in node_cols.items()}
    tour_cols = {k: [row[k] for row in tour_rows] for k in tour_rows[0]}
    tour_cols["scores"] = pa.array(tour_cols["scores"], type=pa.list_(pa.float64()))
    return {
        "regions.parquet": pa.Table.from_pylist(reg_rows, schema=REGIONS_SCHEMA),
        "nodes.parquet": pa.table(nodes, schema=NODES_SCHEMA),
        "tourists.parquet": pa.table(tour_cols),
        TRAVEL_FILE: pa.Table.from_pylist(travel_rows, schema=TRAVEL_SCHEMA),
    }


def build_catalog(
    source: Path | str | None = None,
    out: Path | str | None = None,
    seed: int = VALIDATION_SEED,
    validation_size: int = VALIDATION_SIZE,
    progress: bool = False,
    paper_sets: bool = False,
    device: str | None = "auto",
) -> dict:
    """Parse every instance under ``source`` and (re)write the catalog at ``out``.

    ``paper_sets`` also stores the paper's own tourists (:func:`~optw.catalog.paper_sets.
    build_paper_sets`, correlated sets drawn on ``device``); without it a previous paper file
    is removed. Raises :class:`~optw.catalog.parse.SourceError` on the first bad file, and
    :class:`~optw.outdir.OutDirError` for an ``out`` that is not a catalog folder
    (:func:`check_catalog_dir`), before anything at ``out`` is touched. Returns the manifest.
    """
    source = Path(source) if source else default_source()
    out = Path(out) if out else default_catalog_dir()
    check_catalog_dir(out)
    t0 = time.perf_counter()
    files = discover(source)
    it: Iterable = files
    if progress:
        from tqdm import tqdm

        it = tqdm(files, desc="parsing regions", unit="region")
    regions = [parse_file(path, group) for group, path in it]
    custom, specs = _custom_regions(out)
    tables = _tables(regions + custom, seed, validation_size)
    paper_info = None
    if paper_sets:
        from optw.catalog.paper_sets import build_paper_sets

        tables[PAPER_FILE], paper_info = build_paper_sets(regions, device)
    regions = regions + custom

    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=out))
    except OSError as exc:  # a file on the way, no permission
        raise OutDirError(out, f"cannot be written ({exc.strerror or exc})") from None
    try:
        for name, table in tables.items():
            pq.write_table(table, tmp / name, compression="zstd")
        manifest = {
            "catalog_version": CATALOG_VERSION,
            "source": str(source.resolve()),
            "validation_seed": seed,
            "validation_size": validation_size,
            "regions": len(regions),
            "groups": _group_counts(r.group for r in regions),
            "files": {name: file_sha256(tmp / name) for name in tables},
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": None,
            "custom_regions": specs,
        }
        if paper_info is not None:
            manifest["paper_sets"] = paper_info
        (out / "manifest.json").unlink(missing_ok=True)  # a partial swap must not look valid
        for name in tables:
            os.replace(tmp / name, out / name)
        if paper_info is None:
            (out / PAPER_FILE).unlink(missing_ok=True)
        manifest["build_seconds"] = round(time.perf_counter() - t0, 3)
        tmp_manifest = tmp / "manifest.json"
        tmp_manifest.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(tmp_manifest, out / "manifest.json")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _group_counts(groups: Iterable[str]) -> dict[str, int]:
    """Regions per group: the benchmark groups (0 included), then custom groups by name."""
    groups = list(groups)
    custom = sorted({g for g in groups if g not in GROUPS})
    return {g: groups.count(g) for g in (*GROUPS, *custom)}


def _custom_regions(catalog_dir: Path) -> tuple[list[Region], dict[str, dict]]:
    """The custom regions stored under ``<catalog>/custom/`` (sorted by id) and their specs."""
    folder = catalog_dir / CUSTOM_DIR
    regions, specs = [], {}
    if not folder.is_dir():
        return regions, specs
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        spec_path = sub / CUSTOM_SPEC
        try:
            spec = json.loads(spec_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CustomRegionError(spec_path, None, None, f"unreadable custom region spec "
                                    f"({exc}); fix it or delete {sub}") from None
        regions.append(_load_custom(catalog_dir, spec))
        specs[spec["region"]] = spec
    return regions, specs


def _load_custom(catalog_dir: Path, spec: dict) -> Region:
    rid = spec["region"]
    sub = catalog_dir / CUSTOM_DIR / rid
    travel = sub / spec["travel_times_file"] if spec.get("travel_times_file") else None
    return build_custom_region(rid, sub / spec["points_file"], travel, spec.get("speed_kmh"),
                               spec["group"], f"{CUSTOM_DIR}/{rid}/{spec['points_file']}")


def _read_tables(path: Path) -> dict[str, pa.Table]:
    return {name: pq.read_table(path / name) for name in FILES}


def _merge(old: dict[str, pa.Table], drop: set[str], new: dict[str, pa.Table] | None,
           benchmark_order: list[str]) -> dict[str, pa.Table]:
    """``old`` without the regions in ``drop``, plus ``new``; rows ordered as a build orders
    them (benchmark regions in catalog order, then custom regions by id)."""
    schemas = {"regions.parquet": REGIONS_SCHEMA, "nodes.parquet": NODES_SCHEMA,
               "tourists.parquet": TOURISTS_SCHEMA, TRAVEL_FILE: TRAVEL_SCHEMA}
    out = {}
    for name, table in old.items():
        keep = pc.invert(pc.is_in(table["region"], value_set=pa.array(sorted(drop),
                                                                       pa.string())))
        parts = [table.filter(keep).cast(schemas[name])]
        if new is not None:
            parts.append(new[name].cast(schemas[name]))
        merged = pa.concat_tables(parts)
        ids = np.asarray(merged["region"].to_pylist(), dtype=object)
        rank = {r: i for i, r in enumerate(benchmark_order)}
        custom = sorted(set(ids) - set(rank))
        rank.update({r: len(benchmark_order) + i for i, r in enumerate(custom)})
        order = np.argsort(np.array([rank[r] for r in ids], dtype=np.int64), kind="stable")
        out[name] = merged.take(pa.array(order)).combine_chunks()
    return out


def _restamp_baselines(path: Path, old_files: dict, new_files: dict, stale: set[str],
                       tmp: Path) -> list[tuple[Path, Path]]:
    """Stored ILS results re-stamped for the new catalog files, without the ``stale``
    regions' rows: (temporary file, destination) pairs to move in. Stores stamped for no
    current file are stale already and left as they are (rewritten on their next write)."""
    folder = path / "baselines"
    moves = []
    if not folder.is_dir():
        return moves
    by_sha = {sha: name for name, sha in old_files.items()}
    for f in sorted(folder.glob("*.parquet")):
        table = pq.read_table(f)
        meta = dict(table.schema.metadata or {})
        sha = meta.get(ILS_TOURISTS_META, b"").decode()
        if sha not in by_sha or "region" not in table.column_names:
            continue
        meta[ILS_TOURISTS_META] = new_files[by_sha[sha]].encode()
        keep = pc.invert(pc.is_in(table["region"], value_set=pa.array(sorted(stale),
                                                                       pa.string())))
        dst = tmp / f"baselines-{f.name}"
        pq.write_table(table.filter(keep).replace_schema_metadata(meta), dst,
                       compression="zstd")
        moves.append((dst, f))
    return moves


def _commit(path: Path, old_manifest: dict, tables: dict[str, pa.Table], stale: set[str],
            add: dict[str, dict] | None = None) -> dict:
    """Swap new catalog tables (and a custom region's staged sources, ``add``: spec +
    ``{name: source path}``) in as a build does: everything written to a temporary folder
    first, the manifest removed, files moved in, the manifest written last."""
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=path))
    try:
        for name, table in tables.items():
            pq.write_table(table, tmp / name, compression="zstd")
        files = {**old_manifest.get("files", {}),
                 **{name: file_sha256(tmp / name) for name in tables}}
        ils_moves = _restamp_baselines(path, old_manifest.get("files", {}), files, stale, tmp)
        specs = {k: v for k, v in old_manifest.get("custom_regions", {}).items()
                 if k not in stale}
        staged = {}
        for rid, item in (add or {}).items():
            dst = tmp / "new" / rid
            dst.mkdir(parents=True)
            for name, src in item["files"].items():
                shutil.copyfile(src, dst / name)
            (dst / CUSTOM_SPEC).write_text(json.dumps(item["spec"], indent=2) + "\n")
            staged[rid] = dst
            specs[rid] = item["spec"]
        groups = tables["regions.parquet"]["group"].to_pylist()
        manifest = {**old_manifest, "regions": len(groups), "groups": _group_counts(groups),
                    "files": files, "custom_regions": dict(sorted(specs.items())),
                    "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        try:  # another add/remove/build since we read it: its change would be lost
            current = json.loads((path / "manifest.json").read_text())
        except (OSError, json.JSONDecodeError):
            current = None
        if current != old_manifest:
            raise CatalogError(f"the catalog at {path} changed while this command ran (another "
                               "add, remove or build); nothing was changed: run it again")
        # -- swap: from here on a crash leaves no manifest (readers say "rebuild")
        (path / "manifest.json").unlink(missing_ok=True)
        for name in tables:
            os.replace(tmp / name, path / name)
        for src, dst in ils_moves:
            os.replace(src, dst)
        (tmp / "old").mkdir()
        for rid in stale:
            if (path / CUSTOM_DIR / rid).exists():
                os.replace(path / CUSTOM_DIR / rid, tmp / "old" / rid)
        for rid, src in staged.items():
            (path / CUSTOM_DIR).mkdir(exist_ok=True)
            os.replace(src, path / CUSTOM_DIR / rid)
        os.replace(tmp / "manifest.json", path / "manifest.json")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def add_region(
    region_id: str,
    points: Path | str,
    travel_times: Path | str | None = None,
    speed_kmh: float | None = None,
    group: str = CUSTOM_GROUP,
    catalog: Path | str | None = None,
    replace: bool = False,
) -> Region:
    """Add a custom region to the catalog at ``catalog`` (``optw catalog add``): read and
    check it (:class:`~optw.catalog.custom.CustomRegionError`, the catalog untouched), store
    its tables, its 64 validation tourists and a copy of its source files, atomically. An
    existing custom region of that id needs ``replace``; its stored ILS results are dropped."""
    cat = Catalog(catalog)
    check_region_id(region_id, group, cat.groups)
    if group in cat and group != region_id:
        raise CustomRegionError(None, None, "group", f"group {group!r} is a region id of the "
                                f"catalog at {cat.path}; choose a group name that names no "
                                "region")
    if region_id in cat:
        if not cat.is_custom(region_id):
            raise CustomRegionError(None, None, "region", f"{region_id!r} is a benchmark "
                                    "region; choose another id")
        if not replace:
            raise CustomRegionError(None, None, "region", f"region {region_id!r} is already in "
                                    f"the catalog at {cat.path}; add --replace to replace it")
    points = Path(points)
    ext = points.suffix.lower()
    points_name = f"points{'.geojson' if POINT_FILE_TYPES.get(ext) == 'geojson' else ext}"
    region = build_custom_region(region_id, points, travel_times, speed_kmh, group,
                                 f"{CUSTOM_DIR}/{region_id}/{points_name}")
    files = {points_name: points}
    spec = {"region": region_id, "group": group, "points_file": points_name,
            "points_sha256": region.source_hash, "original_points_file": str(points.resolve()),
            "travel_times_file": None, "travel_times_sha256": None,
            "speed_kmh": region.speed_kmh, "coords": region.coords,
            "decimals": CUSTOM_DECIMALS,
            "added_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if travel_times is not None:
        travel_times = Path(travel_times)
        files["travel_times.csv"] = travel_times
        spec.update(travel_times_file="travel_times.csv",
                    travel_times_sha256=file_sha256(travel_times),
                    original_travel_times_file=str(travel_times.resolve()))
    seed = int(cat.manifest["validation_seed"])
    new = _tables([region], seed, int(cat.manifest["validation_size"]))
    bench = [r for r in cat.list_regions() if not cat.is_custom(r)]
    tables = _merge(_read_tables(cat.path), {region_id}, new, bench)
    _commit(cat.path, cat.manifest, tables, {region_id},
            {region_id: {"spec": spec, "files": files}})
    return region


def remove_region(region_id: str, catalog: Path | str | None = None) -> None:
    """Remove a custom region (``optw catalog remove``), its source files and its stored ILS
    results, atomically; benchmark regions are refused."""
    cat = Catalog(catalog)
    if region_id not in cat:
        customs = [r for r in cat.list_regions() if cat.is_custom(r)]
        raise CustomRegionError(None, None, "region", f"unknown region {region_id!r}; custom "
                                f"regions of {cat.path}: {', '.join(customs) or 'none'}")
    if not cat.is_custom(region_id):
        raise CustomRegionError(None, None, "region", f"{region_id!r} is a benchmark region; "
                                "only custom regions (optw catalog add) can be removed")
    bench = [r for r in cat.list_regions() if not cat.is_custom(r)]
    tables = _merge(_read_tables(cat.path), {region_id}, None, bench)
    _commit(cat.path, cat.manifest, tables, {region_id})


# ----------------------------------------------------------------------------- read


class Catalog:
    """Read access to a built catalog: regions, their tourists, filters."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path else default_catalog_dir()
        manifest_path = self.path / "manifest.json"
        if self.path.exists() and not self.path.is_dir():
            raise CatalogError(f"{self.path} is a file, not a catalog folder")
        if not manifest_path.exists():
            raise CatalogError(
                f"no region catalog at {self.path} (or a build was interrupted); build it with "
                f"`optw catalog build --out {self.path}`"
            )
        try:
            self.manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError) as exc:
            raise CatalogError(f"cannot read {manifest_path} ({exc}); rebuild the catalog with "
                               f"`optw catalog build --out {self.path}`") from None
        version = self.manifest.get("catalog_version") if isinstance(self.manifest, dict) \
            else None
        if version != CATALOG_VERSION:
            raise CatalogError(
                f"region catalog at {self.path} has catalog_version {version}, this code reads "
                f"version {CATALOG_VERSION}; rebuild it with `optw catalog build --out {self.path}`"
            )
        for name in self.manifest.get("files", FILES):
            if not (self.path / name).exists():
                raise CatalogError(
                    f"{self.path / name} is missing; rebuild with `optw catalog build`"
                )
        self._regions = pq.read_table(self.path / "regions.parquet").to_pandas()
        self._regions = self._regions.set_index("region", drop=False)
        self._nodes = None
        self._tourists = None
        self._paper = None
        self._travel = None
        self._cache: dict[str, Region] = {}

    # -- tables
    @property
    def regions_table(self):
        """One row per region (pandas DataFrame, indexed by region id)."""
        return self._regions

    def is_custom(self, region_id: str) -> bool:
        """Whether the region was added with ``optw catalog add`` (a custom group)."""
        self._check(region_id)
        return str(self._regions.at[region_id, "group"]) not in GROUPS

    @property
    def groups(self) -> list[str]:
        """The benchmark groups, then the custom groups present (by name)."""
        return list(_group_counts(self._regions["group"].astype(str)))

    def _travel_table(self):
        if self._travel is None:
            df = pq.read_table(self.path / TRAVEL_FILE).to_pandas()
            self._travel = {rid: g for rid, g in df.groupby("region", sort=False)}
        return self._travel

    @property
    def version(self) -> int:
        return int(self.manifest["catalog_version"])

    def _node_table(self):
        if self._nodes is None:
            df = pq.read_table(self.path / "nodes.parquet").to_pandas()
            self._nodes = {rid: g for rid, g in df.groupby("region", sort=False)}
        return self._nodes

    def _tourist_table(self):
        if self._tourists is None:
            df = pq.read_table(self.path / "tourists.parquet").to_pandas()
            self._tourists = {rid: g for rid, g in df.groupby("region", sort=False)}
        return self._tourists

    @property
    def has_paper_sets(self) -> bool:
        """Whether the catalog holds the paper's sets (``optw catalog build --paper-sets``)."""
        return PAPER_FILE in self.manifest.get("files", {})

    def _paper_table(self):
        if not self.has_paper_sets:
            raise CatalogError(f"the catalog at {self.path} has no paper sets; build them with "
                               f"`optw catalog build --paper-sets --out {self.path}`")
        if self._paper is None:
            df = pq.read_table(self.path / PAPER_FILE).to_pandas()
            self._paper = {rid: g for rid, g in df.groupby("region", sort=False)}
        return self._paper

    def paper_exact(self, region_id: str) -> bool:
        """Whether the region's paper set equals the paper's (False: CPU approximation of
        correlated scores, see :mod:`optw.catalog.paper_sets`)."""
        self._check(region_id)
        return bool(self._paper_table()[region_id]["exact"].all())

    # -- listing
    def list_regions(
        self, group: str | Iterable[str] | None = None, subset: bool = False
    ) -> list[str]:
        """Region ids in catalog order, optionally by group(s) and/or the paper's subset of 28."""
        df = self._regions
        if group is not None:
            groups = [group] if isinstance(group, str) else list(group)
            known = [*self.groups, *([CUSTOM_GROUP] if CUSTOM_GROUP not in self.groups else [])]
            unknown = sorted(set(groups) - set(known))
            if unknown:
                raise UserError(f"unknown group(s) {unknown}; expected some of {known}")
            df = df[df["group"].isin(groups)]
        if subset:
            df = df[df["paper_subset"]]
        return df["region"].tolist()

    def __contains__(self, region_id: str) -> bool:
        return region_id in self._regions.index

    def __len__(self) -> int:
        return len(self._regions)

    def _check(self, region_id: str) -> None:
        if region_id not in self:
            import difflib

            close = difflib.get_close_matches(region_id, self._regions.index, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UnknownRegionError(f"unknown region {region_id!r}{hint}")

    # -- regions
    def region(self, region_id: str) -> Region:
        """The region as a :class:`Region` (cached)."""
        self._check(region_id)
        if region_id not in self._cache:
            nodes = self._node_table()[region_id].sort_values("index")
            row = self._regions.loc[region_id]
            travel = None
            if bool(row["travel_matrix"]):
                t = self._travel_table()[region_id].sort_values("index")
                travel = np.stack(t["minutes"].to_numpy()).astype(np.float64)
            self._cache[region_id] = region_from_row(
                row, {k: nodes[k].to_numpy() for k in (*NODE_ARRAYS, "name", "lat", "lon")},
                travel)
        return self._cache[region_id]

    def tourists(self, region_id: str, kind: str = "validation") -> Tourists:
        """The stored ``benchmark`` (1 tourist), ``validation`` (64) or ``paper`` (64, the
        paper's own set; only in a catalog built with ``--paper-sets``) tourists of a region."""
        self._check(region_id)
        if kind not in TOURIST_KINDS:
            raise UserError(f"unknown tourist kind {kind!r}; expected one of "
                             f"{', '.join(TOURIST_KINDS)}")
        if kind == PAPER_KIND:
            from optw.catalog.paper_sets import tourists_from_rows

            if self.is_custom(region_id):
                raise CatalogError(f"region {region_id} is a custom region: it has no paper "
                                   "set (the paper's tourists exist for benchmark regions only)")
            df = self._paper_table()[region_id]
            return tourists_from_rows(region_id, {c: df[c].to_numpy() for c in df.columns})
        df = self._tourist_table()[region_id]
        df = df[df["kind"] == kind].sort_values("tourist")
        return Tourists(
            region_id=region_id,
            tourist_id=df["tourist"].to_numpy(np.int64),
            kind=kind,
            start_xy=df[["start_x", "start_y"]].to_numpy(np.float64),
            t_start=df["t_start"].to_numpy(np.float64),
            t_end=df["t_end"].to_numpy(np.float64),
            scores=np.stack(df["scores"].to_numpy()).astype(np.float64),
        )

    def benchmark(self, region_id: str) -> Tourists:
        return self.tourists(region_id, "benchmark")

    def validation(self, region_id: str) -> Tourists:
        return self.tourists(region_id, "validation")


def open_catalog(path: Path | str | None = None) -> Catalog:
    """Open the catalog at ``path`` (default: ``$OPTW_CATALOG`` or ``region_catalog/``)."""
    return Catalog(path)
