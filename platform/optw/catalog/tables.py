"""The catalog's Parquet layer: file names, schemas, atomic writes and reading regions back
with pyarrow only. Shared by :mod:`optw.catalog.store` (the catalog) and
:mod:`optw.catalog.paper_sets` (the stand-alone generator), which import it and never each
other's module level: store -> paper_sets -> tables, store -> tables (no cycle).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from optw.catalog.region import GROUPS, Region
from optw.errors import UserError

TRAVEL_FILE = "travel_times.parquet"
#: The paper's own tourists (``--paper-sets``; written by :mod:`optw.catalog.paper_sets`).
PAPER_FILE = "paper_tourists.parquet"
PAPER_KIND = "paper"
#: Per-node float columns of ``nodes.parquet`` (the :class:`Region` arrays of the same names).
NODE_ARRAYS = ("x", "y", "duration", "opening", "closing", "score")
REGIONS_SCHEMA = pa.schema([
    ("region", pa.string()), ("group", pa.string()), ("points", pa.int64()),
    ("nodes", pa.int64()), ("t_start", pa.float64()), ("t_end", pa.float64()),
    ("start_x", pa.float64()), ("start_y", pa.float64()), ("decimals", pa.int64()),
    ("t_day", pa.float64()), ("t_max", pa.float64()), ("s_max_benchmark", pa.float64()),
    ("s_max", pa.float64()), ("max_duration", pa.float64()), ("score_kind", pa.string()),
    ("paper_subset", pa.bool_()), ("source_file", pa.string()), ("source_sha256", pa.string()),
    ("coords", pa.string()), ("metric", pa.string()), ("speed_kmh", pa.float64()),
    ("origin_lat", pa.float64()), ("origin_lon", pa.float64()), ("start_name", pa.string()),
    ("travel_matrix", pa.bool_()),
])
NODES_SCHEMA = pa.schema([
    ("region", pa.string()), ("index", pa.int32()),
    *((k, pa.float64()) for k in NODE_ARRAYS),
    ("name", pa.string()), ("lat", pa.float64()), ("lon", pa.float64()),
])
#: What :func:`_tables` writes for tourists (list items named "item", as pyarrow infers them;
#: Parquet reads them back as "element", so merged tables are cast back to this).
TOURISTS_SCHEMA = pa.schema([
    ("region", pa.string()), ("tourist", pa.int64()), ("kind", pa.string()),
    *((k, pa.float64()) for k in ("start_x", "start_y", "t_start", "t_end")),
    ("scores", pa.list_(pa.float64())),
])
TRAVEL_SCHEMA = pa.schema([
    ("region", pa.string()), ("index", pa.int32()), ("minutes", pa.list_(pa.float64())),
])


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


def region_from_row(row, nodes: dict[str, np.ndarray], travel: np.ndarray | None = None) -> Region:
    """A :class:`Region` from its ``regions.parquet`` row, node columns (in index order) and
    travel-time matrix (custom regions given one)."""
    latlon = row["coords"] == "latlon"
    names = nodes.get("name")
    custom = str(row["group"]) not in GROUPS
    return Region(
        id=str(row["region"]), group=str(row["group"]), t_start=float(row["t_start"]),
        t_end=float(row["t_end"]), decimals=int(row["decimals"]),
        source_file=str(row["source_file"]), source_hash=str(row["source_sha256"]),
        **{k: np.asarray(nodes[k], dtype=np.float64) for k in NODE_ARRAYS},
        names=tuple(str(n) for n in names) if custom and names is not None else None,
        start_name=str(row["start_name"]) if custom and row["start_name"] is not None else None,
        coords=str(row["coords"]), metric=str(row["metric"]),
        lat=np.asarray(nodes["lat"], dtype=np.float64) if latlon else None,
        lon=np.asarray(nodes["lon"], dtype=np.float64) if latlon else None,
        speed_kmh=float(row["speed_kmh"]) if latlon else None,
        origin=(float(row["origin_lat"]), float(row["origin_lon"])) if latlon else None,
        travel=travel,
    )


def read_regions(path: Path | str) -> list[Region]:
    """Every region of a built catalog, read with pyarrow only (no pandas): what the
    stand-alone paper-set generator needs on a bare GPU machine."""
    path = Path(path)
    for name in ("regions.parquet", "nodes.parquet"):
        if not (path / name).exists():
            raise UserError(f"{path / name} does not exist; build the catalog with "
                            f"`optw catalog build --out {path}`")
    nodes = pq.read_table(path / "nodes.parquet")
    ids = np.asarray(nodes.column("region").to_pylist(), dtype=object)
    index = nodes.column("index").to_numpy()
    cols = {k: nodes.column(k).to_numpy(zero_copy_only=False)
            for k in (*NODE_ARRAYS, "name", "lat", "lon")}
    travel = pq.read_table(path / TRAVEL_FILE).to_pylist() if (path / TRAVEL_FILE).exists() \
        else []
    out = []
    for row in pq.read_table(path / "regions.parquet").to_pylist():
        sel = np.flatnonzero(ids == row["region"])
        sel = sel[np.argsort(index[sel])]
        rows = sorted((t for t in travel if t["region"] == row["region"]),
                      key=lambda t: t["index"])
        matrix = np.array([t["minutes"] for t in rows], dtype=np.float64) if rows else None
        out.append(region_from_row(row, {k: v[sel] for k, v in cols.items()}, matrix))
    return out
