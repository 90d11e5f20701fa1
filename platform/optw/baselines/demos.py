"""Demonstrations for imitation (docs/recipes.md): ILS routes of generated training tourists
from a stream of their own, none a validation or benchmark tourist, stored in the catalog with
their region's content hash, checked when read back."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
from tqdm import tqdm

from optw.baselines.ils import ILS_VERSION, solve_ils
from optw.baselines.store import (
    DEMO_SCHEMA,
    StoreError,
    map_tasks,
    read_demos_table,
    region_sha256,
)
from optw.catalog.generator import sample_tourists
from optw.catalog.region import Region, Tourists
from optw.catalog.store import (
    BASELINES_DIR,
    DEMO_FILE,
    Catalog,
    open_catalog,
    write_parquet_atomic,
)
from optw.env.demos import Demonstrations
from optw.env.validate import check_route
from optw.errors import UserError

#: Tag of the demonstrations' random stream (the validation sets' seeds have no tag).
DEMO_STREAM = 0x44454D4F
BLOCK = 64
FIRST_ID = 1_000_000
KEY = ("region", "seed", "score_kind", "ils_version", "index")
SCHEMA = DEMO_SCHEMA


def demos_path(catalog_dir: Path | str) -> Path:
    """The demonstrations' store of the catalog at ``catalog_dir``."""
    return Path(catalog_dir) / BASELINES_DIR / DEMO_FILE


def _key(t: Tourists, i: int) -> bytes:
    return np.concatenate([t.start_xy[i], [t.t_start[i], t.t_end[i]], t.scores[i]]).tobytes()


def demo_tourists(region: Region, n: int, seed: int, held_out: Sequence[Tourists],
                  score_kind: str | None = None) -> Tourists:
    """The region's first ``n`` demonstration tourists for ``seed``, none in ``held_out``."""
    banned = {_key(t, i) for t in held_out for i in range(len(t))}
    crc = zlib.crc32(region.id.encode())
    blocks, have, b = [], 0, 0
    while have < n:
        rng = np.random.default_rng([DEMO_STREAM, int(seed), crc, b])
        block = sample_tourists(region, BLOCK, rng, score_kind, kind="generated")
        keep = np.array([_key(block, i) not in banned for i in range(BLOCK)])
        blocks.append(block[np.flatnonzero(keep)])
        have += int(keep.sum())
        b += 1
    out = Tourists.concat(blocks)[:n] if blocks else sample_tourists(region, 0)
    return Tourists(region.id, np.arange(FIRST_ID, FIRST_ID + n, dtype=np.int64), "generated",
                    out.start_xy, out.t_start, out.t_end, out.scores)


def solve_block(catalog: str, region_id: str, start: int, stop: int, seed: int,
                score_kind: str | None, localize: Callable[[str], str] | None = None) -> list[dict]:
    """Demonstrations ``start..stop-1`` of a region as store rows, each route checked."""
    cat = open_catalog(localize(catalog) if localize is not None else catalog)
    region = cat.region(region_id)
    tourists = demo_tourists(region, stop, seed, [cat.validation(region_id),
                                                  cat.benchmark(region_id)], score_kind)
    rows = []
    for i in range(start, stop):
        res = solve_ils(region, tourists, i)
        check_route(region, res.route, tourists, i, claimed_score=res.score).raise_if_invalid(
            f"the ILS route of demonstration {i} of {region.id}")
        rows.append({
            "region": region.id, "seed": int(seed), "score_kind": score_kind or "default",
            "ils_version": ILS_VERSION, "index": i, "tourist": int(tourists.tourist_id[i]),
            "start_x": float(tourists.start_xy[i, 0]), "start_y": float(tourists.start_xy[i, 1]),
            "t_start": float(tourists.t_start[i]), "t_end": float(tourists.t_end[i]),
            "scores": tourists.scores[i].tolist(), "route": list(res.route), "score": res.score,
            "seconds": res.seconds, "region_sha256": region_sha256(region)})
    return rows


def _write(path: Path, stored: pd.DataFrame, rows: list[dict], stale: pd.Series) -> pd.DataFrame:
    """Write the store without its ``stale`` rows, plus ``rows`` (new ones win per key)."""
    new = pd.DataFrame(rows, columns=SCHEMA.names)
    both = pd.concat([df for df in (stored[~stale], new) if len(df)], ignore_index=True)
    both = both.drop_duplicates(list(KEY), keep="last").sort_values(list(KEY))
    write_parquet_atomic(pa.Table.from_pandas(both.reset_index(drop=True), schema=SCHEMA,
                                              preserve_index=False), path)
    return both


def get_demos(catalog: Catalog, region_ids: Sequence[str], n: int, seed: int,
              score_kind: str | None = None, *, workers: int = 1, progress: bool = False,
              task_catalog: str | None = None, localize: Callable[[str], str] | None = None,
              task_resources: Mapping[str, float] | None = None) -> dict[str, Demonstrations]:
    """``n`` demonstrations of each region of the open ``catalog``, the missing ones and those of
    a changed region computed; each checked (a :class:`StoreError` naming file, region, tourist)."""
    def fresh(df: pd.DataFrame) -> pd.Series:  # of a region as it is now
        return df["region_sha256"] == df["region"].map(digests)

    def ours(df: pd.DataFrame) -> pd.DataFrame:
        return df[(df["seed"] == seed) & (df["score_kind"] == (score_kind or "default"))
                  & (df["ils_version"] == ILS_VERSION) & fresh(df)]

    path = demos_path(catalog.path)
    stored = read_demos_table(path).to_pandas()
    digests = {rid: region_sha256(catalog.region(rid)) for rid in region_ids}
    mine = ours(stored)
    have = mine.groupby("region")["index"].apply(set).to_dict() if len(mine) else {}
    jobs = []
    for rid in region_ids:
        if (first := next((i for i in range(n) if i not in have.get(rid, set())), n)) < n:
            jobs.append((task_catalog or str(catalog.path), rid, first, n, seed, score_kind))
    if jobs:
        rows: list[dict] = []
        with tqdm(total=sum(n - job[2] for job in jobs), desc="demonstrations",
                  unit="tourist", smoothing=0.05, disable=not progress) as bar:
            for got in map_tasks(solve_block, jobs, workers, task_resources, localize=localize):
                rows += got
                bar.update(len(got))
        mine = ours(_write(path, stored, rows, stored["region"].isin(digests) & ~fresh(stored)))
    out = {}
    for rid in region_ids:
        rows_of = mine[(mine["region"] == rid) & (mine["index"] < n)].sort_values("index")
        out[rid] = _demonstrations(path, catalog.region(rid), rows_of)
    return out


def _demonstrations(path: Path, region: Region, df: pd.DataFrame) -> Demonstrations:
    """The rows ``df`` of ``region`` as demonstrations, each checked (:meth:`Demonstrations.check`):
    a :class:`StoreError` naming the file, region and tourist."""
    n = region.n_nodes
    if bad := [int(t) for t, s in zip(df["tourist"], df["scores"], strict=True) if len(s) != n]:
        raise StoreError(path, f"holds a bad row: demonstration of {region.id} tourist {bad[0]} "
                         f"has scores of another length than the region's {n} nodes", region.id)
    tourists = Tourists(
        region.id, df["tourist"].to_numpy(np.int64), "generated",
        df[["start_x", "start_y"]].to_numpy(np.float64), df["t_start"].to_numpy(np.float64),
        df["t_end"].to_numpy(np.float64),
        np.array(df["scores"].tolist(), dtype=np.float64).reshape(len(df), n))
    demos = Demonstrations(tourists, [list(map(int, r)) for r in df["route"]],
                           df["score"].to_numpy(np.float64))
    try:
        demos.check(region)
    except UserError as exc:
        raise StoreError(path, f"holds a bad row: {exc}", region.id) from None
    return demos
