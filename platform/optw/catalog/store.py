"""Build and open the region catalog: Parquet tables, the custom regions' source files under
``custom/<region>/`` and ``manifest.json`` (schema in ``region_catalog/README.md``). Every write
goes to a temporary folder beside the target, moved in manifest last: a failed one leaves the
catalog as it was."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

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
from optw.catalog.generator import VALIDATION_SEED, VALIDATION_SIZE
from optw.catalog.parse import discover, parse_file
from optw.catalog.region import CUSTOM_GROUP, GROUPS, Region, Tourists
from optw.catalog.tables import (
    PAPER_FILE,
    PAPER_KIND,
    SCHEMAS,
    read_regions,
    region_tables,
    tourists_from_rows,
    write_parquet_atomic,  # noqa: F401 - re-exported
)
from optw.errors import OptwError, UserError
from optw.outdir import OutDirError
from optw.paths import PROJECT_ROOT, file_sha256  # noqa: F401 - PROJECT_ROOT re-exported

#: Bump whenever the schema or the meaning of a column changes.
CATALOG_VERSION = 2
FILES = tuple(SCHEMAS)
#: Folder of the custom regions' source files (one sub-folder per region) and spec file name.
CUSTOM_DIR = "custom"
CUSTOM_SPEC = "region.json"
#: Folder of the stores computed from the catalog (``optw.baselines``) and their files: ILS
#: results, ILS results of the paper's sets, demonstrations.
BASELINES_DIR = "baselines"
ILS_FILE, PAPER_ILS_FILE, DEMO_FILE = "ils.parquet", "ils_paper.parquet", "demos.parquet"
#: Schema-metadata key of the ILS stores: the hash of their tourists' catalog file.
ILS_TOURISTS_META = b"optw.catalog_tourists_sha256"
TOURIST_KINDS = ("benchmark", "validation", PAPER_KIND)
#: Named sets of generated tourists a model is evaluated on (ours: the default).
TOURIST_SETS = ("validation", PAPER_KIND)
#: What a catalog folder may hold (``optw catalog build`` refuses a folder of other files).
CATALOG_NAMES = frozenset({"README.md", "manifest.json", *FILES, PAPER_FILE, CUSTOM_DIR,
                           "baselines"})


class CatalogError(OptwError, RuntimeError):
    """A missing, partial or out-of-date catalog."""


class UnknownRegionError(OptwError, KeyError):
    """A region id the catalog does not have (a ``KeyError``; the message names it)."""

    def __str__(self) -> str:  # KeyError's str() would quote the whole message
        return str(self.args[0]) if self.args else ""


def check_catalog_dir(out: Path | str, option: str | None = None) -> Path:
    """``out`` resolved if a catalog may be built there (absent, empty, a catalog or a folder of
    only :data:`CATALOG_NAMES`), else :class:`~optw.outdir.OutDirError`."""
    given = Path(out)
    out = given.resolve()

    def refuse(reason: str) -> OutDirError:
        return OutDirError(given if option else out, reason, option)

    if out.exists() and not out.is_dir():
        raise refuse("is a file, not a catalog folder; choose a new, an empty or a catalog folder")
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


default_source = paths.benchmarks_dir
default_catalog_dir = paths.catalog_dir


def _write_tables(tables: dict[str, pa.Table], folder: Path) -> dict[str, str]:
    for name, table in tables.items():
        pq.write_table(table, folder / name, compression="zstd")
    return {name: file_sha256(folder / name) for name in tables}


def _swap(path: Path, tmp: Path, tables: Iterable[str], manifest: dict,
          moves: Iterable[tuple[Path, Path]] = ()) -> None:
    """Move ``tables`` from ``tmp`` and each (source, destination) of ``moves`` into ``path``,
    the old manifest out first, the new one in last: cut short, it leaves none, not a wrong one."""
    (path / "manifest.json").unlink(missing_ok=True)
    for name in tables:
        os.replace(tmp / name, path / name)
    for src, dst in moves:
        os.replace(src, dst)
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp / "manifest.json", path / "manifest.json")


def build_catalog(source: Path | str | None = None, out: Path | str | None = None,
                  progress: bool = False, paper_sets: bool = False,
                  device: str | None = "auto") -> dict:
    """Parse every instance under ``source`` and (re)write the catalog at ``out`` with its
    custom regions; returns the manifest. ``paper_sets`` also stores the paper's own tourists
    (drawn on ``device``); without it a previous paper file is removed."""
    source = Path(source) if source else default_source()
    out = Path(out) if out else default_catalog_dir()
    check_catalog_dir(out)
    t0 = time.perf_counter()
    files: Iterable = discover(source)
    if progress:
        from tqdm import tqdm

        files = tqdm(files, desc="parsing regions", unit="region")
    regions = [parse_file(path, group) for group, path in files]
    custom, specs = _custom_regions(out)
    tables = region_tables(regions + custom, VALIDATION_SEED, VALIDATION_SIZE)
    manifest = {"catalog_version": CATALOG_VERSION, "source": str(source.resolve()),
                "validation_seed": VALIDATION_SEED, "validation_size": VALIDATION_SIZE,
                "regions": len(regions) + len(custom),
                "groups": _group_counts(r.group for r in regions + custom), "files": {},
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "build_seconds": None, "custom_regions": specs}
    if paper_sets:
        from optw.catalog.paper_sets import build_paper_sets

        tables[PAPER_FILE], manifest["paper_sets"] = build_paper_sets(regions, device)
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=out))
    except OSError as exc:  # a file on the way, no permission
        raise OutDirError(out, f"cannot be written ({exc.strerror or exc})") from None
    try:
        manifest["files"] = _write_tables(tables, tmp)
        manifest["build_seconds"] = round(time.perf_counter() - t0, 3)
        old_paper = out / PAPER_FILE
        moves = [(old_paper, tmp / PAPER_FILE)] if old_paper.exists() and not paper_sets else []
        _swap(out, tmp, tables, manifest, moves)  # an old paper file goes into tmp, deleted
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _group_counts(groups: Iterable[str]) -> dict[str, int]:
    """Regions per group: the benchmark groups (0 included), then custom groups by name."""
    counts = Counter(groups)
    return {g: counts[g] for g in (*GROUPS, *sorted(set(counts) - set(GROUPS)))}


def _custom_regions(catalog_dir: Path) -> tuple[list[Region], dict[str, dict]]:
    """The custom regions stored under ``<catalog>/custom/`` (sorted by id) and their specs."""
    folder = catalog_dir / CUSTOM_DIR
    regions, specs = [], {}
    subs = folder.iterdir() if folder.is_dir() else []
    for sub in sorted(p for p in subs if p.is_dir() and not p.name.startswith(".")):
        try:
            spec = json.loads((sub / CUSTOM_SPEC).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CustomRegionError(sub / CUSTOM_SPEC, None, None, f"unreadable custom region "
                                    f"spec ({exc}); fix it or delete {sub}") from None
        rid = spec["region"]
        travel = sub / spec["travel_times_file"] if spec.get("travel_times_file") else None
        regions.append(build_custom_region(
            rid, sub / spec["points_file"], travel, spec.get("speed_kmh"), spec["group"],
            f"{CUSTOM_DIR}/{rid}/{spec['points_file']}"))
        specs[rid] = spec
    return regions, specs


def clear_command(store_file: Path, region: str | None = None) -> str:
    """The `optw baseline clear` of the store ``store_file`` (only ``region``'s rows if given)."""
    store = "demos" if store_file.name == DEMO_FILE else "ils"
    only = f" --regions {region}" if region else ""
    return f"optw baseline clear --store {store}{only} --catalog {store_file.parent.parent}"


def _restamp_baselines(path: Path, old_files: dict, new_files: dict, stale: str,
                       tmp: Path) -> list[tuple[Path, Path]]:
    """(temporary file, destination) pairs of the stores of ``baselines/`` without the ``stale``
    region's rows, the ILS results re-stamped for the new files (stores stamped for no current
    file stay stale); an unreadable store is a :class:`CatalogError` naming it."""
    by_sha = {sha: name for name, sha in old_files.items()}
    moves = []
    for name in (ILS_FILE, PAPER_ILS_FILE, DEMO_FILE):
        if not (f := path / BASELINES_DIR / name).is_file():
            continue
        try:
            table = pq.read_table(f)
        except (pa.ArrowException, OSError) as exc:
            why = str(exc).splitlines()[0].split(f"'{f}': ")[-1]
            raise CatalogError(f"{f} cannot be read ({why}); clear it with `{clear_command(f)}` "
                               "and run this again; nothing was changed") from None
        meta = dict(table.schema.metadata or {})
        sha = meta.get(ILS_TOURISTS_META, b"").decode()
        ours = "region" in table.column_names and pa.types.is_string(table["region"].type)
        if not ours or (name != DEMO_FILE and sha not in by_sha):
            continue  # not a store of ours, or stale as a whole: its reader says so
        if sha in by_sha:
            meta[ILS_TOURISTS_META] = new_files[by_sha[sha]].encode()
        dst = tmp / f"baselines-{name}"
        pq.write_table(table.filter(pc.not_equal(table["region"], stale))
                       .replace_schema_metadata(meta), dst, compression="zstd")
        moves.append((dst, f))
    return moves


def _commit(cat: Catalog, region_id: str, region: Region | None = None,
            spec: dict | None = None, sources: dict[str, Path] | None = None) -> None:
    """Replace the custom region ``region_id`` of ``cat`` by ``region`` (None: remove it) with its
    ``spec`` and ``sources``, rewriting the tables as a build does (:func:`_swap`)."""
    path, old_manifest = cat.path, cat.manifest
    regions = [r for r in read_regions(path) if r.id != region_id]
    regions += [region] if region is not None else []
    regions.sort(key=lambda r: (r.is_custom, r.id if r.is_custom else ""))
    tables = region_tables(regions, int(old_manifest["validation_seed"]),
                           int(old_manifest["validation_size"]))
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=path))
    try:
        files = {**old_manifest.get("files", {}), **_write_tables(tables, tmp)}
        ils_moves = _restamp_baselines(path, old_manifest.get("files", {}), files, region_id, tmp)
        specs = {k: v for k, v in old_manifest.get("custom_regions", {}).items() if k != region_id}
        staged = tmp / "new"
        if spec is not None:
            staged.mkdir()
            for name, src in sources.items():
                shutil.copyfile(src, staged / name)
            (staged / CUSTOM_SPEC).write_text(json.dumps(spec, indent=2) + "\n")
            specs[region_id] = spec
        groups = tables["regions.parquet"]["group"].to_pylist()
        manifest = {**old_manifest, "regions": len(groups), "groups": _group_counts(groups),
                    "files": files, "custom_regions": dict(sorted(specs.items())),
                    "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        try:  # another add/remove/build since we read it: its change would be lost
            changed = json.loads((path / "manifest.json").read_text()) != old_manifest
        except (OSError, json.JSONDecodeError):
            changed = True
        if changed:
            raise CatalogError(f"the catalog at {path} changed while this command ran (another "
                               "add, remove or build); nothing was changed: run it again")
        folder = path / CUSTOM_DIR / region_id
        moves = ils_moves + ([(folder, tmp / "old")] if folder.exists() else [])
        if spec is not None:
            folder.parent.mkdir(exist_ok=True)
            moves.append((staged, folder))
        _swap(path, tmp, tables, manifest, moves)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def add_region(region_id: str, points: Path | str, travel_times: Path | str | None = None,
               speed_kmh: float | None = None, group: str = CUSTOM_GROUP,
               catalog: Path | str | None = None, replace: bool = False) -> Region:
    """Add a custom region with its validation tourists and source files (``optw catalog add``),
    atomically; ``replace`` replaces one, dropping its stored ILS results and demonstrations."""
    cat = Catalog(catalog)
    check_region_id(region_id, group, cat.groups)  # benchmark region ids are refused here
    if group in cat:
        raise CustomRegionError(None, None, "group", f"group {group!r} is a region id of the "
                                f"catalog at {cat.path}; choose a group name that names no region")
    if region_id in cat and not replace:
        raise CustomRegionError(None, None, "region", f"region {region_id!r} is already in "
                                f"the catalog at {cat.path}; add --replace to replace it")
    points = Path(points)
    ext = points.suffix.lower()
    points_name = f"points{'.geojson' if POINT_FILE_TYPES.get(ext) == 'geojson' else ext}"
    region = build_custom_region(region_id, points, travel_times, speed_kmh, group,
                                 f"{CUSTOM_DIR}/{region_id}/{points_name}")
    sources = {points_name: points}
    spec = {"region": region_id, "group": group, "points_file": points_name,
            "points_sha256": region.source_hash, "original_points_file": str(points.resolve()),
            "travel_times_file": None, "travel_times_sha256": None,
            "speed_kmh": region.speed_kmh, "coords": region.coords, "decimals": CUSTOM_DECIMALS,
            "added_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if travel_times is not None:
        travel_times = Path(travel_times)
        sources["travel_times.csv"] = travel_times
        spec.update(travel_times_file="travel_times.csv",
                    travel_times_sha256=file_sha256(travel_times),
                    original_travel_times_file=str(travel_times.resolve()))
    _commit(cat, region_id, region, spec, sources)
    return region


def remove_region(region_id: str, catalog: Path | str | None = None) -> None:
    """Remove a custom region with its source files, ILS results and demonstrations, atomically."""
    cat = Catalog(catalog)
    if region_id not in cat:
        customs = [r for r in cat.list_regions() if cat.is_custom(r)]
        raise CustomRegionError(None, None, "region", f"unknown region {region_id!r}; custom "
                                f"regions of {cat.path}: {', '.join(customs) or 'none'}")
    if not cat.is_custom(region_id):
        raise CustomRegionError(None, None, "region", f"{region_id!r} is a benchmark region; "
                                "only custom regions (optw catalog add) can be removed")
    _commit(cat, region_id)


class Catalog:
    """Read access to a built catalog: regions, their tourists, filters."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path else default_catalog_dir()
        manifest_path = self.path / "manifest.json"
        if self.path.exists() and not self.path.is_dir():
            raise CatalogError(f"{self.path} is a file, not a catalog folder")
        if not manifest_path.exists():
            raise CatalogError(f"no region catalog at {self.path} (or a build was interrupted); "
                               f"build it with `optw catalog build --out {self.path}`")
        try:
            self.manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError) as exc:
            raise CatalogError(f"cannot read {manifest_path} ({exc}); rebuild the catalog with "
                               f"`optw catalog build --out {self.path}`") from None
        version = self.manifest.get("catalog_version") if isinstance(self.manifest, dict) else None
        if version != CATALOG_VERSION:
            raise CatalogError(f"region catalog at {self.path} has catalog_version {version}, "
                               f"this code reads version {CATALOG_VERSION}; rebuild it with "
                               f"`optw catalog build --out {self.path}`")
        for name in self.manifest.get("files", FILES):
            if not (self.path / name).exists():
                raise CatalogError(f"{self.path / name} is missing; rebuild with "
                                   "`optw catalog build`")
        #: One row per region (pandas DataFrame, indexed by region id).
        self.regions_table = pq.read_table(self.path / "regions.parquet").to_pandas() \
            .set_index("region", drop=False)
        self._by_region: dict[str, dict] = {}
        self._cache: dict[str, Region] = {}

    def _table(self, name: str) -> dict:
        """The rows of the table file ``name`` by region id (read once)."""
        if name not in self._by_region:
            df = pq.read_table(self.path / name).to_pandas()
            self._by_region[name] = {rid: g for rid, g in df.groupby("region", sort=False)}
        return self._by_region[name]

    def is_custom(self, region_id: str) -> bool:
        """Whether the region was added with ``optw catalog add``."""
        self._check(region_id)
        return str(self.regions_table.at[region_id, "group"]) not in GROUPS

    @property
    def groups(self) -> list[str]:
        """The benchmark groups, then the custom groups present (by name)."""
        return list(_group_counts(self.regions_table["group"].astype(str)))

    @property
    def has_paper_sets(self) -> bool:
        """Whether the catalog holds the paper's sets (``optw catalog build --paper-sets``)."""
        return PAPER_FILE in self.manifest.get("files", {})

    def _paper_table(self) -> dict:
        if not self.has_paper_sets:
            raise CatalogError(f"the catalog at {self.path} has no paper sets; build them with "
                               f"`optw catalog build --paper-sets --out {self.path}`")
        return self._table(PAPER_FILE)

    def paper_exact(self, region_id: str) -> bool:
        """Whether the region's paper set equals the paper's (False: a CPU approximation)."""
        self._check(region_id)
        return bool(self._paper_table()[region_id]["exact"].all())

    def list_regions(self, group: str | Iterable[str] | None = None, subset: bool = False
                     ) -> list[str]:
        """Region ids in catalog order, optionally by group(s) and/or the paper's subset of 28."""
        df = self.regions_table
        if group is not None:
            groups = [group] if isinstance(group, str) else list(group)
            known = list(dict.fromkeys([*self.groups, CUSTOM_GROUP]))
            if unknown := sorted(set(groups) - set(known)):
                raise UserError(f"unknown group(s) {unknown}; expected some of {known}")
            df = df[df["group"].isin(groups)]
        if subset:
            df = df[df["paper_subset"]]
        return df["region"].tolist()

    def __contains__(self, region_id: str) -> bool:
        return region_id in self.regions_table.index

    def __len__(self) -> int:
        return len(self.regions_table)

    def _check(self, region_id: str) -> None:
        if region_id not in self:
            import difflib

            close = difflib.get_close_matches(region_id, self.regions_table.index, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UnknownRegionError(f"unknown region {region_id!r}{hint}")

    def region(self, region_id: str) -> Region:
        """The region (every region is read on the first call)."""
        self._check(region_id)
        if not self._cache:
            self._cache = {r.id: r for r in read_regions(self.path)}
        return self._cache[region_id]

    def tourists(self, region_id: str, kind: str = "validation") -> Tourists:
        """The region's stored ``benchmark`` (1), ``validation`` (64) or ``paper`` (64) tourists."""
        self._check(region_id)
        if kind not in TOURIST_KINDS:
            raise UserError(f"unknown tourist kind {kind!r}; expected one of "
                            f"{', '.join(TOURIST_KINDS)}")
        if kind == PAPER_KIND:
            if self.is_custom(region_id):
                raise CatalogError(f"region {region_id} is a custom region: it has no paper "
                                   "set (the paper's tourists exist for benchmark regions only)")
            df = self._paper_table()[region_id]
        else:
            df = self._table("tourists.parquet")[region_id]
            df = df[df["kind"] == kind]
        return tourists_from_rows(region_id, {c: df[c].to_numpy() for c in df.columns}, kind)

    def benchmark(self, region_id: str) -> Tourists:
        return self.tourists(region_id, "benchmark")

    def validation(self, region_id: str) -> Tourists:
        return self.tourists(region_id, "validation")


def open_catalog(path: Path | str | None = None) -> Catalog:
    """Open the catalog at ``path`` (default: ``$OPTW_CATALOG`` or ``region_catalog/``)."""
    return Catalog(path)
