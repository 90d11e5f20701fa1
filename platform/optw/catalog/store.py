"""Build and open the region catalog (Parquet files + manifest).

Layout of a catalog folder (schema in ``region_catalog/README.md``)::

    regions.parquet   one row per region
    nodes.parquet     one row per (region, node)
    tourists.parquet  one row per (region, tourist): benchmark (id 0) + 64 validation (1..64)
    paper_tourists.parquet  optional (``--paper-sets``): the paper's own 64 tourists per region
                      (ids 1000..1063, flagged exact or not; :mod:`optw.catalog.paper_sets`)
    manifest.json     catalog_version, build settings, row counts and file hashes

A build writes into a temporary folder beside the target and only then moves the files in,
manifest last, so a failed build leaves the previous catalog exactly as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from optw import paths
from optw.catalog.generator import VALIDATION_SEED, VALIDATION_SIZE, validation_tourists
from optw.catalog.parse import discover, parse_file
from optw.catalog.region import GROUPS, PAPER_SUBSET, Region, Tourists, benchmark_tourist
from optw.paths import PROJECT_ROOT  # noqa: F401 - re-exported by optw.catalog

#: Bump whenever the schema or the meaning of a column changes.
CATALOG_VERSION = 1
FILES = ("regions.parquet", "nodes.parquet", "tourists.parquet")
#: The paper's own tourists (``--paper-sets``; written by :mod:`optw.catalog.paper_sets`).
PAPER_FILE = "paper_tourists.parquet"
PAPER_KIND = "paper"
#: Stored tourist kinds: the benchmark tourist, our validation tourists, the paper's sets.
TOURIST_KINDS = ("benchmark", "validation", PAPER_KIND)
#: Named sets of generated tourists a model is evaluated on (ours: the default).
TOURIST_SETS = ("validation", PAPER_KIND)
_NODE_ARRAYS = ("x", "y", "duration", "opening", "closing", "score")


class CatalogError(RuntimeError):
    """A missing, partial or out-of-date catalog."""


def default_source() -> Path:
    """``$OPTW_BENCHMARKS``, else ``../shared/benchmarks/optw`` beside the project."""
    return paths.benchmarks_dir()


def default_catalog_dir() -> Path:
    """``$OPTW_CATALOG``, else the project's ``region_catalog/``."""
    return paths.catalog_dir()


# ----------------------------------------------------------------------------- build


def _tables(regions: list[Region], seed: int, n_val: int) -> dict[str, pa.Table]:
    reg_rows, node_cols, tour_rows = [], {k: [] for k in (
        "region", "index", "x", "y", "duration", "opening", "closing", "score")}, []
    for r in regions:
        reg_rows.append({
            "region": r.id, "group": r.group, "points": r.n_points, "nodes": r.n_nodes,
            "t_start": r.t_start, "t_end": r.t_end, "start_x": r.start_xy[0],
            "start_y": r.start_xy[1], "decimals": r.decimals, "t_day": r.t_day,
            "t_max": r.t_max, "s_max_benchmark": r.s_max_benchmark, "s_max": r.s_max,
            "max_duration": r.max_duration, "score_kind": r.default_score_kind,
            "paper_subset": r.id in PAPER_SUBSET, "source_file": r.source_file,
            "source_sha256": r.source_hash,
        })
        node_cols["region"] += [r.id] * r.n_nodes
        node_cols["index"].append(np.arange(r.n_nodes, dtype=np.int32))
        for k in ("x", "y", "duration", "opening", "closing", "score"):
            node_cols[k].append(getattr(r, k))
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
    nodes = {k: (v if k == "region" else np.concatenate(v)) for k, v in node_cols.items()}
    tour_cols = {k: [row[k] for row in tour_rows] for k in tour_rows[0]}
    tour_cols["scores"] = pa.array(tour_cols["scores"], type=pa.list_(pa.float64()))
    return {
        "regions.parquet": pa.Table.from_pylist(reg_rows),
        "nodes.parquet": pa.table(nodes),
        "tourists.parquet": pa.table(tour_cols),
    }


def write_parquet_atomic(table: pa.Table, path: Path) -> Path:
    """Write ``table`` to a temporary file beside ``path`` and rename it over ``path``: a
    reader never sees a half-written file (concurrent writers use distinct temporary names)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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
    is removed. Raises :class:`~optw.catalog.parse.SourceError` on the first bad file, before
    anything at ``out`` is touched. Returns the manifest.
    """
    source = Path(source) if source else default_source()
    out = Path(out) if out else default_catalog_dir()
    t0 = time.perf_counter()
    files = discover(source)
    it: Iterable = files
    if progress:
        from tqdm import tqdm

        it = tqdm(files, desc="parsing regions", unit="region")
    regions = [parse_file(path, group) for group, path in it]
    tables = _tables(regions, seed, validation_size)
    paper_info = None
    if paper_sets:
        from optw.catalog.paper_sets import build_paper_sets

        tables[PAPER_FILE], paper_info = build_paper_sets(regions, device)

    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=out))
    try:
        for name, table in tables.items():
            pq.write_table(table, tmp / name, compression="zstd")
        manifest = {
            "catalog_version": CATALOG_VERSION,
            "source": str(source.resolve()),
            "validation_seed": seed,
            "validation_size": validation_size,
            "regions": len(regions),
            "groups": {g: sum(r.group == g for r in regions) for g in GROUPS},
            "files": {name: _sha256(tmp / name) for name in tables},
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": None,
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


# ----------------------------------------------------------------------------- read


class Catalog:
    """Read access to a built catalog: regions, their tourists, filters."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path else default_catalog_dir()
        manifest_path = self.path / "manifest.json"
        if not manifest_path.exists():
            raise CatalogError(
                f"no region catalog at {self.path} (or a build was interrupted); build it with "
                f"`optw catalog build --out {self.path}`"
            )
        self.manifest = json.loads(manifest_path.read_text())
        version = self.manifest.get("catalog_version")
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
        self._cache: dict[str, Region] = {}

    # -- tables
    @property
    def regions_table(self):
        """One row per region (pandas DataFrame, indexed by region id)."""
        return self._regions

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
            unknown = sorted(set(groups) - set(GROUPS))
            if unknown:
                raise ValueError(f"unknown group(s) {unknown}; expected some of {list(GROUPS)}")
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
            raise KeyError(f"unknown region {region_id!r}{hint}")

    # -- regions
    def region(self, region_id: str) -> Region:
        """The region as a :class:`Region` (cached)."""
        self._check(region_id)
        if region_id not in self._cache:
            nodes = self._node_table()[region_id].sort_values("index")
            self._cache[region_id] = _region(self._regions.loc[region_id],
                                             {k: nodes[k].to_numpy() for k in _NODE_ARRAYS})
        return self._cache[region_id]

    def tourists(self, region_id: str, kind: str = "validation") -> Tourists:
        """The stored ``benchmark`` (1 tourist), ``validation`` (64) or ``paper`` (64, the
        paper's own set; only in a catalog built with ``--paper-sets``) tourists of a region."""
        self._check(region_id)
        if kind not in TOURIST_KINDS:
            raise ValueError(f"unknown tourist kind {kind!r}; expected one of "
                             f"{', '.join(TOURIST_KINDS)}")
        if kind == PAPER_KIND:
            from optw.catalog.paper_sets import tourists_from_rows

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


def _region(row, nodes: dict[str, np.ndarray]) -> Region:
    """A :class:`Region` from its ``regions.parquet`` row and node columns (in index order)."""
    return Region(
        id=str(row["region"]), group=str(row["group"]), t_start=float(row["t_start"]),
        t_end=float(row["t_end"]), decimals=int(row["decimals"]),
        source_file=str(row["source_file"]), source_hash=str(row["source_sha256"]),
        **{k: np.asarray(nodes[k], dtype=np.float64) for k in _NODE_ARRAYS},
    )


def read_regions(path: Path | str) -> list[Region]:
    """Every region of a built catalog, read with pyarrow only (no pandas): what the
    stand-alone paper-set generator needs on a bare GPU machine."""
    path = Path(path)
    for name in ("regions.parquet", "nodes.parquet"):
        if not (path / name).exists():
            raise FileNotFoundError(f"{path / name} does not exist; build the catalog with "
                                    f"`optw catalog build --out {path}`")
    nodes = pq.read_table(path / "nodes.parquet")
    ids = np.asarray(nodes.column("region").to_pylist(), dtype=object)
    index = nodes.column("index").to_numpy()
    cols = {k: nodes.column(k).to_numpy() for k in _NODE_ARRAYS}
    out = []
    for row in pq.read_table(path / "regions.parquet").to_pylist():
        sel = np.flatnonzero(ids == row["region"])
        sel = sel[np.argsort(index[sel])]
        out.append(_region(row, {k: v[sel] for k, v in cols.items()}))
    return out
