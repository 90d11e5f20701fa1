"""Time to quality: validation scores against CPU time, for the training recipes side by side.

Trains each region from scratch (fixed seed, one torch thread) with each recipe
(``TrainConfig`` ``recipe``: ``paper``, ``fast``, ``imitate``; docs/recipes.md; a recipe
with changed settings is written ``fast+beta=0+lr=5e-4``). Every
``--eval-every`` CPU-seconds of training it runs greedy and beam-8 on the region's validation
tourists (evaluation is not training time) and records the mean scores beside the stored ILS
mean of the same tourists. A recipe that learns from demonstrations is charged for them: its
curve starts at the CPU seconds their ILS routes took. Runs ``--jobs`` regions × recipes at a
time, each in a process of its own (CPU time is each process's own, so runs side by side do
not count each other's work). Writes ``learning_curves.csv``, ``learning_curves.png`` (score
against CPU minutes, ILS as a line) and ``learning_summary.json`` to ``--out``, and prints per
region and recipe the final scores and gaps to ILS and the **CPU time to ILS parity** (the
first evaluation whose mean reaches the ILS mean; greedy and beam-8)::

    .venv/bin/python benchmarks/bench_learning.py --out runs/bench_learning   # ~47 min
    .venv/bin/python benchmarks/bench_learning.py --short --out /tmp/bl      # pr01, ~5 min
    .venv/bin/python benchmarks/bench_learning.py --regions pr01 --minutes 2 \
        --recipes fast,fast+beta=0,fast+beta=0.05 --out /tmp/entropy     # a setting's effect

Needs the built catalog (``make catalog``); ILS results of the regions' validation tourists
and the demonstrations that are not stored yet are computed first and stored.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REGIONS = ("pr01", "c101", "t101", "pr10")
RECIPES = ("paper", "fast", "imitate")
#: CPU minutes per recipe and region (larger regions learn slower)
MINUTES = {"pr01": 4.0, "c101": 3.0, "t101": 5.0, "pr10": 8.0}
#: cosine schedules decay over the time budget (these runs have no epoch budget)
HORIZON = {"fast": {"lr_schedule": "cosine_time"}, "imitate": {"lr_schedule": "cosine_time"}}
BEAMS = 8


class Curve:
    """A training callback: evaluates the model every ``every_s`` CPU-seconds of training
    (``start_s`` already spent, e.g. on demonstrations) and stops the run after ``budget_s``."""

    def __init__(self, region, tourists, ils_mean: float, every_s: float, budget_s: float,
                 start_s: float = 0.0):
        self.region, self.tourists, self.ils = region, tourists, ils_mean
        self.every_s, self.budget_s = every_s, budget_s
        self.points: list[dict[str, float]] = []
        self.train_s = start_s
        self._t = 0.0
        self._next = start_s + every_s

    def on_train_start(self, ctx) -> None:
        self._evaluate(ctx)
        self._t = time.process_time()  # after the first evaluation: it is not training time

    def _evaluate(self, ctx) -> None:
        from optw.decode import solve
        from optw.model import ModelConfig, PointerNet

        state = ctx.snapshot()
        model = PointerNet(ModelConfig.from_dict(state["config"]))
        model.load_state_dict(state["state_dict"])
        model.eval()
        greedy = solve(model, self.region, self.tourists, "greedy")
        beam = solve(model, self.region, self.tourists, "beam", beams=BEAMS, greedy=greedy)
        g = sum(s.score for s in greedy) / len(greedy)
        b = sum(s.score for s in beam) / len(beam)
        self.points.append({"cpu_s": self.train_s, "epochs": ctx.epoch, "greedy": g,
                            "beam": b})

    def on_epoch_end(self, ctx, metrics) -> None:
        now = time.process_time()
        self.train_s += now - self._t
        self._t = now
        if self.train_s >= self._next or self.train_s >= self.budget_s:
            self._next = self.train_s + self.every_s
            self._evaluate(ctx)
            self._t = time.process_time()
            if self.train_s >= self.budget_s:
                ctx.stop = True

    def on_validation(self, ctx, metrics) -> None: ...

    def on_train_end(self, ctx) -> None: ...


def first_reaching(points: list[dict[str, float]], key: str, target: float) -> float | None:
    """CPU seconds of the first point whose ``key`` reaches ``target`` (None: never)."""
    return next((p["cpu_s"] for p in points if p[key] >= target), None)


def recipe_settings(recipe: str) -> dict[str, Any]:
    """``TrainConfig`` keys of a recipe name such as ``fast+beta=0`` (values parsed as TOML)."""
    import tomllib

    name, *changes = recipe.split("+")
    out: dict[str, Any] = {"recipe": name}
    for change in changes:
        key, _, value = change.partition("=")
        out[key] = tomllib.loads(f"v = {value}")["v"]
    return out


def one_run(rid: str, recipe: str, minutes: float, every_s: float, seed: int,
            n_tourists: int, catalog_dir: str | None) -> dict[str, Any]:
    """Train ``rid`` with ``recipe`` in this process (one thread); its curve and summary."""
    sys.path.insert(0, str(ROOT / "platform"))
    import torch

    from optw.catalog import open_catalog
    from optw.evaluate.protocol import ils_validation_means
    from optw.train import TrainConfig, train

    torch.set_num_threads(1)
    catalog = open_catalog(catalog_dir)
    ils = ils_validation_means(str(catalog.path), [rid], n_tourists)[rid]
    config = TrainConfig.from_dict({
        "regions": [rid], "epochs": 10**9, "val_every": 0, "val_tourists": 1,
        "checkpoint_every": 0, "seed": seed, "threads": 1,
        **HORIZON.get(recipe.split("+")[0], {}), "max_minutes": minutes,
        **recipe_settings(recipe)})
    demos, demo_s = None, 0.0
    if config.demos:
        from optw.baselines.demos import get_demos

        t0 = time.process_time()  # the demonstrations' ILS, as if none were stored
        demos = get_demos(catalog, [rid], config.demos, config.seed, config.score_kind,
                          write=False)
        demo_s = time.process_time() - t0
    curve = Curve(catalog.region(rid), catalog.validation(rid)[:n_tourists], ils, every_s,
                  minutes * 60, demo_s)
    train(config, catalog, [curve], demos=demos)
    last = curve.points[-1]
    return {"region": rid, "recipe": recipe, "ils": ils, "cpu_s": curve.train_s,
            "demo_s": demo_s, "epochs": last["epochs"], "greedy": last["greedy"],
            "beam": last["beam"], "greedy_gap_pct": 100 * (last["greedy"] - ils) / ils,
            "beam_gap_pct": 100 * (last["beam"] - ils) / ils,
            "parity_greedy_s": first_reaching(curve.points, "greedy", ils),
            "parity_beam_s": first_reaching(curve.points, "beam", ils),
            "points": curve.points}


def ensure_ils(regions: list[str], n_tourists: int, catalog_dir: str | None) -> None:
    """Store the ILS results of the regions' validation tourists that are missing."""
    sys.path.insert(0, str(ROOT / "platform"))
    from optw.baselines.store import run_ils_baseline
    from optw.catalog import open_catalog
    from optw.evaluate.protocol import ils_validation_means

    catalog = open_catalog(catalog_dir)
    missing = [r for r in regions if r not in ils_validation_means(str(catalog.path), regions,
                                                                     n_tourists)]
    if missing:
        print(f"ILS baseline of {missing} (validation tourists) first", flush=True)
        run_ils_baseline(catalog.path, regions=missing, tourists="validation", progress=False,
                         workers=1)


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regions = list(dict.fromkeys(s["region"] for s in summary))
    colors = {"paper": "tab:blue", "fast": "tab:orange", "imitate": "tab:green"}
    fig, axes = plt.subplots(1, len(regions), figsize=(4.6 * len(regions), 3.8), squeeze=False)
    for ax, rid in zip(axes[0], regions, strict=True):
        for s in (s for s in summary if s["region"] == rid):
            xs = [p["cpu_s"] / 60 for p in s["points"]]
            c = colors.get(s["recipe"])
            ax.plot(xs, [p["greedy"] for p in s["points"]], color=c,
                    label=f"{s['recipe']} greedy")
            ax.plot(xs, [p["beam"] for p in s["points"]], color=c, ls="--",
                    label=f"{s['recipe']} beam-{BEAMS}")
        ils = next(s["ils"] for s in summary if s["region"] == rid)
        ax.axhline(ils, color="black", lw=1, ls=":", label="ILS")
        ax.set_title(rid)
        ax.set_xlabel("CPU minutes (one thread)")
        ax.set_ylabel("mean validation score")
        lo = min(p["greedy"] for s in summary if s["region"] == rid for p in s["points"][1:])
        ax.set_ylim(max(0.0, min(lo, ils) * 0.9), ils * 1.06)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--regions", default=",".join(REGIONS), help="comma-separated region ids")
    p.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated recipes")
    p.add_argument("--minutes", type=float, default=None,
                   help="CPU minutes per region and recipe (default: "
                        + ", ".join(f"{r} {m:g}" for r, m in MINUTES.items()) + ")")
    p.add_argument("--eval-every", type=float, default=20.0,
                   help="CPU seconds of training between evaluations")
    p.add_argument("--tourists", type=int, default=64, help="validation tourists per region")
    p.add_argument("--jobs", type=int, default=2, help="runs side by side (processes)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--short", action="store_true",
                   help="pr01 only, 1.5 CPU minutes per recipe, an evaluation every 10 s")
    p.add_argument("--catalog", default=None)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    regions = ["pr01"] if args.short else [r.strip() for r in args.regions.split(",") if r]
    recipes = [r.strip() for r in args.recipes.split(",") if r]
    minutes = {r: 1.5 if args.short else (args.minutes or MINUTES.get(r, 5.0)) for r in regions}
    every = 10.0 if args.short else args.eval_every
    ensure_ils(regions, args.tourists, args.catalog)
    runs = [(rid, recipe) for rid in regions for recipe in recipes]
    runs.sort(key=lambda x: -minutes[x[0]])  # longest first
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(one_run, rid, recipe, minutes[rid], every, args.seed,
                               args.tourists, args.catalog) for rid, recipe in runs]
        summary = []
        for f in futures:
            s = f.result()
            summary.append(s)
            print(f"{s['region']} {s['recipe']}: {s['cpu_s'] / 60:.1f} CPU-min, {s['epochs']} "
                  f"epochs, greedy {s['greedy']:.1f} / beam-{BEAMS} {s['beam']:.1f} "
                  f"(ILS {s['ils']:.1f})", flush=True)
    order = {(r, c): i for i, (r, c) in enumerate((r, c) for r in regions for c in recipes)}
    summary.sort(key=lambda s: order[(s["region"], s["recipe"])])
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "learning_curves.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["region", "recipe", "ils", "cpu_s", "epochs",
                                          "greedy", "beam"])
        w.writeheader()
        for s in summary:
            for pnt in s["points"]:
                w.writerow({"region": s["region"], "recipe": s["recipe"], "ils": s["ils"],
                            **pnt})
    plot(summary, args.out / "learning_curves.png")
    (args.out / "learning_summary.json").write_text(json.dumps(
        {"summary": summary, "seed": args.seed, "beams": BEAMS}, indent=2))

    def mins(s: float | None) -> str:
        return "never" if s is None else f"{s / 60:.2f}"

    print(f"\n{'region':<7}{'recipe':<16}{'CPU-min':>8}{'epochs':>8}{'greedy':>8}{'gap%':>7}"
          f"{'beam':>8}{'gap%':>7}{'parity greedy':>15}{'parity beam':>13}")
    for s in summary:
        print(f"{s['region']:<7}{s['recipe']:<16}{s['cpu_s'] / 60:>8.1f}{s['epochs']:>8}"
              f"{s['greedy']:>8.1f}{s['greedy_gap_pct']:>7.1f}{s['beam']:>8.1f}"
              f"{s['beam_gap_pct']:>7.1f}{mins(s['parity_greedy_s']):>15}"
              f"{mins(s['parity_beam_s']):>13}")
    print(f"curves: {args.out / 'learning_curves.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
