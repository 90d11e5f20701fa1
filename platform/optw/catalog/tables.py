"""The catalog's Parquet layer, without pandas (shared with the stand-alone
:mod:`optw.catalog.paper_sets`): file names, schemas, region tables, atomic writes, reading."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from optw.catalog.generator import validation_tourists
from optw.catalog.region import GROUPS, PAPER_SUBSET, Region, Tourists, benchmark_tourist
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
#: Tourist rows, one per tourist (``scores``: one per node).
TOURISTS_SCHEMA = pa.schema([
    ("region", pa.string()), ("tourist", pa.int64()), ("kind", pa.string()),
    *((k, pa.float64()) for k in ("start_x", "start_y", "t_start", "t_end")),
    ("scores", pa.list_(pa.float64())),
])
TRAVEL_SCHEMA = pa.schema([
    ("region", pa.string()), ("index", pa.int32()), ("minutes", pa.list_(pa.float64())),
])
#: The table files of a catalog and their schemas.
SCHEMAS = {"regions.parquet": REGIONS_SCHEMA, "nodes.parquet": NODES_SCHEMA,
           "tourists.parquet": TOURISTS_SCHEMA, TRAVEL_FILE: TRAVEL_SCHEMA}


def tourist_columns(t: Tourists) -> dict:
    """The columns of :data:`TOURISTS_SCHEMA` holding the tourists ``t``."""
    k = len(t)
    return {"region": [t.region_id] * k, "tourist": t.tourist_id, "kind": [t.kind] * k,
            "start_x": t.start_xy[:, 0], "start_y": t.start_xy[:, 1], "t_start": t.t_start,
            "t_end": t.t_end, "scores": list(t.scores)}


def tourists_from_rows(region_id: str, rows: dict[str, np.ndarray], kind: str = PAPER_KIND
                       ) -> Tourists:
    """Tourists back from the columns of their rows, sorted by tourist id."""
    order = np.argsort(rows["tourist"], kind="stable")
    return Tourists(
        region_id=region_id, tourist_id=np.asarray(rows["tourist"], np.int64)[order], kind=kind,
        start_xy=np.stack([rows["start_x"], rows["start_y"]], -1).astype(np.float64)[order],
        t_start=np.asarray(rows["t_start"], np.float64)[order],
        t_end=np.asarray(rows["t_end"], np.float64)[order],
        scores=np.stack([np.asarray(s, np.float64) for s in rows["scores"]])[order],
        start_rows_f32=kind == PAPER_KIND)


def region_tables(regions: list[Region], seed: int, n_val: int) -> dict[str, pa.Table]:
    """The catalog tables of ``regions``, with ``n_val`` validation tourists each."""
    rows, nodes, tourists, travel = [], [], [], [TRAVEL_SCHEMA.empty_table()]
    for r in regions:
        n = r.n_nodes
        rows.append({
            "region": r.id, "group": r.group, "points": r.n_points, "nodes": n,
            "t_start": r.t_start, "t_end": r.t_end, "start_x": r.start_xy[0],
            "start_y": r.start_xy[1], "decimals": r.decimals, "t_day": r.t_day,
            "t_max": r.t_max, "s_max_benchmark": r.s_max_benchmark, "s_max": r.s_max,
            "max_duration": r.max_duration, "score_kind": r.default_score_kind,
            "paper_subset": r.id in PAPER_SUBSET, "source_file": r.source_file,
            "source_sha256": r.source_hash, "coords": r.coords, "metric": r.metric,
            "speed_kmh": r.speed_kmh, "origin_lat": r.origin[0] if r.origin else None,
            "origin_lon": r.origin[1] if r.origin else None, "start_name": r.start_name,
            "travel_matrix": r.travel is not None})
        nodes.append(pa.table({
            "region": [r.id] * n, "index": np.arange(n, dtype=np.int32),
            **{k: getattr(r, k) for k in NODE_ARRAYS},
            "name": list(r.names) if r.names else [None] * n,
            "lat": r.lat if r.lat is not None else [None] * n,
            "lon": r.lon if r.lon is not None else [None] * n}, schema=NODES_SCHEMA))
        if r.travel is not None:
            travel.append(pa.table({"region": [r.id] * n, "index": np.arange(n, dtype=np.int32),
                                    "minutes": list(r.travel)}, schema=TRAVEL_SCHEMA))
        for batch in (benchmark_tourist(r), validation_tourists(r, n_val, seed)):
            tourists.append(pa.table(tourist_columns(batch), schema=TOURISTS_SCHEMA))
    return {"regions.parquet": pa.Table.from_pylist(rows, schema=REGIONS_SCHEMA),
            "nodes.parquet": pa.concat_tables(nodes).combine_chunks(),
            "tourists.parquet": pa.concat_tables(tourists).combine_chunks(),
            TRAVEL_FILE: pa.concat_tables(travel).combine_chunks()}


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


def read_regions(path: Path | str) -> list[Region]:
    """Every region of a built catalog, in catalog order (pyarrow only, no pandas)."""
    path = Path(path)
    for name in ("regions.parquet", "nodes.parquet"):
        if not (path / name).exists():
            raise UserError(f"{path / name} does not exist; build the catalog with "
                            f"`optw catalog build --out {path}`")
    nodes = pq.read_table(path / "nodes.parquet")
    cols = {k: nodes.column(k).to_numpy(zero_copy_only=False) for k in nodes.column_names}
    travel = pq.read_table(path / TRAVEL_FILE).to_pylist() if (path / TRAVEL_FILE).exists() else []
    out = []
    for row in pq.read_table(path / "regions.parquet").to_pylist():
        sel = np.flatnonzero(cols["region"] == row["region"])
        node = {k: v[sel[np.argsort(cols["index"][sel])]] for k, v in cols.items()}
        rows = sorted((t for t in travel if t["region"] == row["region"]), key=lambda t: t["index"])
        custom, latlon = row["group"] not in GROUPS, row["coords"] == "latlon"
        out.append(Region(
            id=row["region"], group=row["group"], t_start=row["t_start"], t_end=row["t_end"],
            decimals=row["decimals"], source_file=row["source_file"],
            source_hash=row["source_sha256"],
            **{k: node[k].astype(np.float64) for k in NODE_ARRAYS},
            names=tuple(node["name"]) if custom else None,
            start_name=row["start_name"] if custom else None, coords=row["coords"],
            metric=row["metric"], lat=node["lat"].astype(np.float64) if latlon else None,
            lon=node["lon"].astype(np.float64) if latlon else None,
            speed_kmh=row["speed_kmh"] if latlon else None,
            origin=(row["origin_lat"], row["origin_lon"]) if latlon else None,
            travel=np.array([t["minutes"] for t in rows], dtype=np.float64) if rows else None))
    return out
