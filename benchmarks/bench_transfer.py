"""Transfer onto a new region: time to ILS parity, fine-tuned from a global model vs from scratch.

The new region is the worked example's city (``examples/city/pois.csv``, 43 POIs of Lucca),
added with ``optw.catalog.add_region`` to a private copy of the catalog (``--out``/catalog; the
project's catalog is not touched). Its validation tourists' ILS results are computed first with
optw's baseline API (``run_ils_baseline``, stored in that copy) and their mean is the target.

Training settings are a job profile's (``--profile``, default ``quick``: the fast recipe with
the batch sizes ``optw job run`` uses on CPUs): its ``[train]`` table for the source and
scratch models, its ``[finetune]`` table (``finetune_lr``) for fine-tuning; epochs are
unbounded and the time budgets below end each run.

1. **Source**: a global model of the source groups (``--from-groups``, default ``solomon``: all
   56 Solomon regions, regions mixed per step) trained for ``--source-minutes`` of training
   (``TrainConfig.max_minutes``), or reused from
   ``--source FILE`` / ``<out>/source-<groups>.pt`` of an earlier run (``--reuse-source``).
   This is the cost a platform pays once for all the regions it transfers to; it is reported
   apart.
2. **Fine-tuned** from the source model (``finetune = true``, the profile's fixed
   ``finetune_lr`` or ``--finetune-lr``) and **scratch** (fresh weights), the same seed and
   ``--threads`` torch threads, ``--minutes`` of training each. Every ``--eval-every`` seconds
   of training (evaluation time excluded) greedy and beam-16 run on the city's validation
   tourists (``bench_learning.Curve``).

**Time to ILS parity**: the training seconds of the first evaluation whose greedy mean reaches
the ILS mean (and the same for beam-16). Writes ``transfer_curves.csv``,
``transfer_curves.png`` and ``transfer_summary.json`` to ``--out``::

    .venv/bin/python benchmarks/bench_transfer.py --out runs/bench_transfer           # ~45 min
    .venv/bin/python benchmarks/bench_transfer.py --short --out /tmp/bt               # ~8 min

Needs the built catalog (``make catalog``).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_learning import Curve, first_reaching  # noqa: E402 - shared with bench_learning

CITY = ROOT / "examples" / "city" / "pois.csv"
REGION = "lucca"
STARTS = ("finetuned", "scratch")
BEAMS = 16


def private_catalog(src_dir: Path | None, dst: Path, points: Path, region_id: str):
    """A copy of the catalog at ``dst`` (made once) with ``region_id`` added from ``points``."""
    from optw.catalog import Catalog, add_region
    from optw.catalog.store import FILES

    src = Catalog(src_dir)
    if not (dst / "manifest.json").exists():
        dst.mkdir(parents=True, exist_ok=True)
        for name in (*src.manifest.get("files", FILES), "manifest.json"):
            shutil.copy(src.path / name, dst / name)
    cat = Catalog(dst)
    if region_id not in cat:
        add_region(region_id, points, catalog=dst)
        cat = Catalog(dst)
    return cat


def ils_target(catalog, region_id: str, n_tourists: int) -> float:
    """The stored ILS mean of the region's first validation tourists (computed first)."""
    from optw.baselines.store import run_ils_baseline
    from optw.evaluate.protocol import ils_validation_means

    ils = ils_validation_means(str(catalog.path), [region_id], n_tourists)
    if region_id not in ils:
        print(f"ILS baseline of {region_id} (validation tourists) first", flush=True)
        t0 = time.perf_counter()
        run_ils_baseline(catalog.path, regions=[region_id], tourists="validation",
                         progress=False)
        print(f"  ILS: {time.perf_counter() - t0:.0f} s", flush=True)
        ils = ils_validation_means(str(catalog.path), [region_id], n_tourists)
    return ils[region_id]


def settings(profile, regions: list[str], seed: int, threads: int, finetune: bool = False,
             finetune_lr: float | None = None, **changes: Any):
    """The profile's TrainConfig for ``regions`` (its fine-tuning one with ``finetune``), with
    unbounded epochs, no validation or checkpoints during the run, and ``changes``."""
    base = profile.finetune.replace(regions=list(regions)) if finetune else profile.train.replace(
        regions=regions)
    extra = {"finetune_lr": finetune_lr} if finetune and finetune_lr else {}
    return base.replace(**{"epochs": 1_000_000, "max_minutes": None, "val_every": 0,
                           "val_tourists": 1, "checkpoint_every": 0, "seed": seed,
                           "threads": threads, **extra, **changes})


def source_model(catalog, profile, groups: list[str], minutes: float, threads: int, seed: int,
                 path: Path, reuse: bool) -> tuple[Path, dict[str, Any]]:
    """The global model of ``groups`` at ``path`` (trained unless reused) and its facts."""
    from optw.model import save_model
    from optw.train import train

    if reuse and path.exists():
        print(f"source model reused: {path}", flush=True)
        return path, {"reused": True}
    regions = catalog.list_regions(groups)
    config = settings(profile, regions, seed, threads, mix_regions=True, max_minutes=minutes)
    print(f"source: global model of {groups} ({len(regions)} regions), {minutes:g} min",
          flush=True)
    t0 = time.perf_counter()
    result = train(config, catalog)
    wall = time.perf_counter() - t0
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(result.model, path)
    return path, {"reused": False, "regions": len(regions), "wall_s": wall,
                  "epochs": result.epochs}


def curves(catalog, profile, region_id: str, ils: float, source: Path, minutes: float,
           every_s: float, threads: int, seed: int, n_tourists: int,
           finetune_lr: float | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from optw.train import train

    region, tourists = catalog.region(region_id), catalog.validation(region_id)[:n_tourists]
    rows, summary = [], []
    for start in STARTS:
        config = settings(profile, [region_id], seed, threads, start == "finetuned",
                          finetune_lr)
        curve = Curve(region, tourists, ils, every_s, minutes * 60, beams=BEAMS)
        t0 = time.perf_counter()
        train(config, catalog, [curve], init=source if start == "finetuned" else None)
        wall = time.perf_counter() - t0
        rows += [{"region": region_id, "start": start, "ils": ils, **p} for p in curve.points]
        first, last = curve.points[0], curve.points[-1]
        summary.append({
            "region": region_id, "start": start, "ils": ils, "train_s": curve.train_s,
            "wall_s": wall, "epochs": last["epochs"], "greedy_at_0": first["greedy"],
            "greedy": last["greedy"], f"beam{BEAMS}": last[f"beam{BEAMS}"],
            "greedy_gap_pct": 100 * (last["greedy"] - ils) / ils,
            f"beam{BEAMS}_gap_pct": 100 * (last[f"beam{BEAMS}"] - ils) / ils,
            "parity_greedy_s": first_reaching(curve.points, "greedy", ils),
            f"parity_beam{BEAMS}_s": first_reaching(curve.points, f"beam{BEAMS}", ils),
            "points": curve.points})
        print(f"{region_id} {start}: {curve.train_s / 60:.1f} min, {last['epochs']} epochs, "
              f"greedy {first['greedy']:.1f} -> {last['greedy']:.1f} / beam-{BEAMS} "
              f"{last[f'beam{BEAMS}']:.1f} (ILS {ils:.1f})", flush=True)
    return rows, summary


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, x in zip(axes, ("seconds", "epochs"), strict=True):
        for start, color in zip(STARTS, ("tab:green", "tab:gray"), strict=True):
            pts = [r for r in rows if r["start"] == start]
            xs = [p[x] / (60 if x == "seconds" else 1) for p in pts]
            ax.plot(xs, [p["greedy"] for p in pts], color=color, label=f"{start} greedy")
            ax.plot(xs, [p[f"beam{BEAMS}"] for p in pts], color=color, ls="--",
                    label=f"{start} beam-{BEAMS}")
        ax.axhline(rows[0]["ils"], color="black", lw=1, ls=":", label="ILS")
        ax.set_xlabel("training minutes" if x == "seconds" else "epochs")
        ax.set_ylabel(f"{rows[0]['region']}: mean validation score")
        ax.set_ylim(bottom=max(0.0, ax.get_ylim()[0]))
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", type=Path, default=CITY, help="the new region's points file")
    p.add_argument("--region", default=REGION, help="its id in the private catalog")
    p.add_argument("--from-groups", default="solomon", help="source groups (comma-separated)")
    p.add_argument("--source-minutes", type=float, default=20.0,
                   help="training minutes of the source global model")
    p.add_argument("--source", type=Path, default=None,
                   help="a source model file to reuse (skips stage 1)")
    p.add_argument("--reuse-source", action="store_true",
                   help="reuse <out>/source-<groups>.pt of an earlier run if it exists")
    p.add_argument("--minutes", type=float, default=10.0,
                   help="training minutes on the new region, per start (fine-tuned, scratch)")
    p.add_argument("--eval-every", type=float, default=30.0, help="seconds between evaluations")
    p.add_argument("--profile", default="quick",
                   help="job profile whose [train] and [finetune] settings are used")
    p.add_argument("--finetune-lr", type=float, default=None,
                   help="fine-tuning lr (default: the profile's [finetune] finetune_lr)")
    p.add_argument("--tourists", type=int, default=64, help="validation tourists")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--short", action="store_true",
                   help="source 2 min, 1.5 min per start, an evaluation every 15 s, 32 tourists")
    p.add_argument("--catalog", type=Path, default=None, help="the catalog to copy")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.short:
        args.source_minutes, args.minutes, args.eval_every = 2.0, 1.5, 15.0
        args.tourists = min(args.tourists, 32)
    import torch

    from optw.distributed.profile import load_profile

    torch.set_num_threads(args.threads)
    profile = load_profile(args.profile)
    groups = [g.strip() for g in args.from_groups.split(",") if g.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    catalog = private_catalog(args.catalog, args.out / "catalog", args.points, args.region)
    ils = ils_target(catalog, args.region, args.tourists)
    src_path = args.source or args.out / f"source-{'-'.join(groups)}.pt"
    source, source_facts = source_model(catalog, profile, groups, args.source_minutes,
                                        args.threads, args.seed, src_path,
                                        args.reuse_source or bool(args.source))
    rows, summary = curves(catalog, profile, args.region, ils, source, args.minutes,
                           args.eval_every, args.threads, args.seed, args.tourists,
                           args.finetune_lr)
    with open(args.out / "transfer_curves.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot(rows, args.out / "transfer_curves.png")
    by = {s["start"]: s for s in summary}
    ft, sc = by["finetuned"]["parity_greedy_s"], by["scratch"]["parity_greedy_s"]
    result = {"region": args.region, "points": str(args.points), "from_groups": groups,
              "ils_mean": ils, "tourists": args.tourists, "threads": args.threads,
              "seed": args.seed, "short": args.short, "minutes": args.minutes,
              "profile": args.profile,
              "finetune_lr": args.finetune_lr or profile.finetune.finetune_lr,
              "source": {"path": str(source),
                                                          "minutes": args.source_minutes,
                                                          **source_facts},
              "parity_greedy_s": {"finetuned": ft, "scratch": sc},
              "times_sooner": (sc / ft) if ft and sc else None,
              "summary": summary, "wall_s": time.perf_counter() - t0}
    (args.out / "transfer_summary.json").write_text(json.dumps(result, indent=2))

    def mins(s: float | None) -> str:
        return "never" if s is None else f"{s / 60:.2f}"

    print(f"\n{'start':<10}{'min':>6}{'epochs':>8}{'greedy@0':>10}{'greedy':>8}{'gap%':>7}"
          f"{'beam16':>8}{'gap%':>7}{'parity greedy':>15}{'parity beam16':>15}")
    for s in summary:
        print(f"{s['start']:<10}{s['train_s'] / 60:>6.1f}{s['epochs']:>8}"
              f"{s['greedy_at_0']:>10.1f}{s['greedy']:>8.1f}{s['greedy_gap_pct']:>7.1f}"
              f"{s['beam16']:>8.1f}{s['beam16_gap_pct']:>7.1f}"
              f"{mins(s['parity_greedy_s']):>15}{mins(s['parity_beam16_s']):>15}")
    print(f"ILS mean {ils:.1f} over {args.tourists} validation tourists of {args.region}; "
          f"source model of {groups}: "
          + ("reused" if source_facts["reused"] else f"{args.source_minutes:g} min of training"))
    print(f"time to greedy ILS parity (min): fine-tuned {mins(ft)}, scratch {mins(sc)}"
          + (f" ({result['times_sooner']:.1f}x sooner)" if result["times_sooner"] else ""))
    print(f"curves: {args.out / 'transfer_curves.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
