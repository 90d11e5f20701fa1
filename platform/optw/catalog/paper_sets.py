"""The paper's own generated tourists ("paper sets"), drawn as the authors' released generator
draws them, to hold our results against the paper's generated-instance table region by region.

Correlated sets are exact only on CUDA (CPU draws: ``exact = False``); how the authors' generator
draws and the GPU run committed as :data:`DATA_FILE`: ``docs/paper.md``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from optw.catalog.region import GROUPS, START_BOX, Region, Tourists
from optw.catalog.tables import (
    PAPER_FILE,
    PAPER_KIND,
    TOURISTS_SCHEMA,
    read_regions,
    tourist_columns,
    tourists_from_rows,
    write_parquet_atomic,
)
from optw.errors import OptwError, UserError
from optw.outdir import check_out_dir, replace_dir

DEVICES = ("auto", "cpu", "cuda", "cuda:N")
PAPER_SEED = 2925
PAPER_SIZE = 64
#: Paper tourist ``i`` (0-based) has id ``PAPER_FIRST_ID + i``: never an id of ours (0..64).
PAPER_FIRST_ID = 1000
#: Exact sets made on a GPU and committed as data (absent until made).
DATA_FILE = Path(__file__).resolve().parent / "data" / PAPER_FILE
#: Schema of :data:`PAPER_FILE` (in a catalog, in :data:`DATA_FILE` and in a stand-alone run).
SCHEMA = pa.schema([*TOURISTS_SCHEMA, ("exact", pa.bool_()), ("device", pa.string()),
                    ("torch", pa.string()), ("source_sha256", pa.string())])


@dataclass(frozen=True)
class PaperSet:
    """One region's paper set, whether it is exact, where its noise was drawn, which torch."""

    tourists: Tourists
    exact: bool
    device: str
    torch_version: str


def check_device(device: str) -> None:
    """Refuse a ``device`` that is not one of :data:`DEVICES` (:class:`~optw.errors.UserError`)."""
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise UserError(f"--device {device!r}: expected one of {', '.join(DEVICES)}")


def _device(device: str | None) -> str:
    """``auto`` / None -> ``cuda`` when available, else ``cpu``; ``cuda`` must be available."""
    import torch

    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    check_device(str(device))
    if device != "cpu" and not torch.cuda.is_available():
        raise UserError(f"--device {device}: CUDA is not available on this machine")
    return device


def generate_paper_set(region: Region, device: str | None = "cpu") -> PaperSet:
    """The region's paper set as the authors' generator draws it (see the module docstring)."""
    import torch

    device = _device(device)
    cpu = torch.Generator().manual_seed(PAPER_SEED)
    correlated = region.default_score_kind == "correlated"
    noise = torch.Generator(device=device).manual_seed(PAPER_SEED) if correlated else None
    day = int(region.t_day)
    m = int(4 / 24 * day)
    t0, t1 = int(region.t_start), int(region.t_end)
    s = int(region.s_max)
    n = region.n_nodes
    lo, hi = START_BOX[region.group]
    dur = torch.tensor(region.duration, dtype=torch.float32, device=device)
    d_max = int(region.max_duration) or 1
    ts, te = np.empty(PAPER_SIZE), np.empty(PAPER_SIZE)
    xy, scores = np.empty((PAPER_SIZE, 2)), np.zeros((PAPER_SIZE, n))
    for k in range(PAPER_SIZE):
        try:
            start = int(torch.randint(t0 - m, min(int(15 / 24 * day), t1 + m), (1,), generator=cpu))
            end = int(torch.randint(max(int(12 / 24 * day), start + m), t1 + m, (1,),
                                    generator=cpu))
        except RuntimeError as exc:
            raise UserError(f"region {region.id}: the paper's generator cannot draw the times "
                             f"of tourist {k} (T {t0}-{t1}, day {day}): {exc}") from None
        if correlated:
            raw = s / d_max * dur + 10 * torch.randn(n, generator=noise, device=device)
            sc = torch.round(torch.clamp(raw, 1, s))
        else:
            sc = torch.randint(1, s, (n,), generator=cpu)
        ts[k], te[k] = start, end
        xy[k] = [float(lo + (hi - lo) * torch.rand(1, generator=cpu)) for _ in "xy"]
        scores[k] = sc.double().cpu().numpy()
    scores[:, 0] = scores[:, -1] = 0.0
    tourists = Tourists(region.id, np.arange(PAPER_FIRST_ID, PAPER_FIRST_ID + PAPER_SIZE),
                        PAPER_KIND, xy, ts, te, scores, start_rows_f32=True)
    exact = not correlated or device != "cpu"
    return PaperSet(tourists, exact, device if correlated else "cpu", torch.__version__)


def paper_table(sets: Iterable[tuple[Region, PaperSet]]) -> pa.Table:
    """Rows of :data:`SCHEMA`, one per (region, paper tourist)."""
    parts = [SCHEMA.empty_table()]
    for region, ps in sets:
        k = len(ps.tourists)
        parts.append(pa.table({**tourist_columns(ps.tourists), "exact": [ps.exact] * k,
                               "device": [ps.device] * k, "torch": [ps.torch_version] * k,
                               "source_sha256": [region.source_hash] * k}, schema=SCHEMA))
    return pa.concat_tables(parts).combine_chunks()


def _rows_by_region(table: pa.Table) -> dict[str, dict[str, np.ndarray]]:
    data = {name: np.asarray(table.column(name).to_pylist(), dtype=object)
            for name in table.column_names}
    return {rid: {k: v[data["region"] == rid] for k, v in data.items()}
            for rid in dict.fromkeys(data["region"])}


def _from_data(region: Region, cpu_set: PaperSet, rows: dict[str, np.ndarray] | None,
               source: Path | None) -> PaperSet | None:
    """The committed exact set of ``region`` when there is one for its file (not for another
    version of it); its times and start points must equal the CPU draws (as on every device)."""
    if rows is None or not bool(np.all(rows["exact"])) \
            or set(rows["source_sha256"].tolist()) != {region.source_hash}:
        return None
    data = tourists_from_rows(region.id, rows)
    if not all(np.array_equal(getattr(data, k), getattr(cpu_set.tourists, k))
               for k in ("tourist_id", "t_start", "t_end", "start_xy")):
        raise UserError(f"{source}: the times or start points of region {region.id} differ from "
                         "the paper's CPU draws; regenerate the file (see optw.catalog.paper_sets)")
    return PaperSet(data, True, str(rows["device"][0]), str(rows["torch"][0]))


def build_paper_sets(regions: list[Region], device: str | None = "auto",
                     data_file: Path | None = DATA_FILE) -> tuple[pa.Table, dict]:
    """Every region's paper set for a catalog build and a summary for the manifest; correlated
    sets come from ``data_file`` when it has the region, else are drawn on ``device``."""
    device = _device(device)
    committed = {}
    if data_file is not None and Path(data_file).exists():
        committed = _rows_by_region(pq.read_table(data_file))
    sets, from_data = [], []
    for region in regions:
        ps = generate_paper_set(region, "cpu")
        if region.default_score_kind == "correlated":
            if (exact := _from_data(region, ps, committed.get(region.id), data_file)) is not None:
                from_data.append(region.id)
                ps = exact
            elif device != "cpu":
                ps = generate_paper_set(region, device)
        sets.append((region, ps))
    return paper_table(sets), {
        "seed": PAPER_SEED, "size": PAPER_SIZE, "first_id": PAPER_FIRST_ID, "device": device,
        "regions": len(sets), "exact_regions": sum(ps.exact for _, ps in sets),
        "approximate_regions": [r.id for r, ps in sets if not ps.exact],
        "from_data_file": from_data}


def _regions(args: argparse.Namespace) -> list[Region]:
    if args.catalog is not None:
        regions = read_regions(args.catalog)
    else:
        from optw.catalog.parse import discover, parse_file
        from optw.paths import benchmarks_dir

        regions = [parse_file(p, g) for g, p in discover(args.source or benchmarks_dir())]
    groups = [g for item in args.groups or [] for g in item.split(",") if g]
    if bad := sorted(set(groups) - set(GROUPS)):
        raise UserError(f"--groups: unknown group(s) {bad}; expected some of {list(GROUPS)}")
    wanted = [r for item in args.regions or [] for r in item.split(",") if r]
    if unknown := sorted(set(wanted) - {r.id for r in regions}):
        raise UserError(f"--regions: unknown region(s) {unknown}")
    return [r for r in regions if r.group in GROUPS and (not groups or r.group in groups)
            and (not wanted or r.id in wanted)]


#: The kind of ``--out`` folder (:mod:`optw.outdir`) of :func:`main`.
OUT_KIND = "paper-sets"


def main(argv: list[str] | None = None) -> int:
    """Write the paper sets of the chosen regions to ``OUT/paper_tourists.parquet`` (``OUT``:
    new, empty or an earlier output of this command, replaced; see :mod:`optw.outdir`)."""
    p = argparse.ArgumentParser(prog="python -m optw.catalog.paper_sets",
                                description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--catalog", type=Path, default=None,
                     help="read the regions from a built catalog (pyarrow only)")
    src.add_argument("--source", type=Path, default=None,
                     help="read the benchmark files (default: $OPTW_BENCHMARKS)")
    p.add_argument("--device", default="auto", help="cpu, cuda[:N] or auto (default)")
    p.add_argument("--groups", action="append", default=None, help="e.g. gavalas")
    p.add_argument("--regions", action="append", default=None, help="e.g. t101,t102")
    p.add_argument("--out", type=Path, required=True,
                   help="output folder: new, empty or an earlier output (replaced; other "
                   "files there stay)")
    args = p.parse_args(argv)
    try:
        device = _device(args.device)
        check_out_dir(args.out, OUT_KIND, option="--out")
        sets = [(r, generate_paper_set(r, device)) for r in _regions(args)]
        with replace_dir(args.out, OUT_KIND, f"{len(sets)} regions on {device}",
                         option="--out") as tmp:
            write_parquet_atomic(paper_table(sets), tmp / PAPER_FILE)
    except (OptwError, OSError) as exc:
        print(f"paper_sets: error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(sets)} regions ({sum(ps.exact for _, ps in sets)} exact) on {device} -> "
          f"{args.out / PAPER_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
