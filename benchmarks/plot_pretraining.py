"""The pretraining curves of the released global models: greedy and beam-8 gap to ILS (median
of each group's curve regions, 64 validation tourists each) against training CPU hours, read
from ``pretraining/<group>/curve.csv`` (a label marks where a call stepped the lr); the
released models' medians (every region of the group) as points. Writes a PNG and prints the
last point of each curve::

    .venv/bin/python benchmarks/plot_pretraining.py --out docs/pretraining_curves.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state", type=Path, default=ROOT / "pretraining")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "pretraining_curves.png")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "platform"))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from optw.distributed.pretrain import read_curve
    from optw.model.release import release_groups, release_manifest

    groups = [g for g in ("solomon", "cordeau", "gavalas") if (args.state / g).is_dir()]
    released = set(release_groups())
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    # the job's targets: greedy within -3 %, beam 8 at least +1 % above ILS
    for ax, method, title, target in ((axes[0], "greedy", "greedy", -3),
                                      (axes[1], "beam", "beam 8", 1)):
        for i, group in enumerate(groups):
            rows = read_curve(args.state / group / "curve.csv")
            color = f"C{i}"
            if rows:
                x = [float(r["cpu_hours"]) for r in rows]
                y = [float(r[f"{method}_above_ils"]) for r in rows]
                ax.plot(x, y, "-o", ms=3, color=color, label=f"{group} (pretraining)")
                for k in range(1, len(rows)):  # where a call stepped the lr
                    if rows[k]["lr"] != rows[k - 1]["lr"]:
                        ax.annotate(f"lr → {float(rows[k]['lr']):.1e}", (x[k], y[k]),
                                    xytext=(0, -26), textcoords="offset points", ha="center",
                                    fontsize=7, color=color,
                                    arrowprops={"arrowstyle": "-", "color": color})
            if group in released:
                card = release_manifest(group)
                ax.plot(card["training"]["cpu_hours"],
                        card["validation"][f"median_{method}_above_ils"], "*", ms=14,
                        color=color, label=f"{group} release v{card['version']} (cooled down)")
        ax.axhline(0, color="black", lw=0.8)
        ax.axhline(target, color="grey", lw=0.8, ls="--")
        ax.annotate("target", (0, target), xytext=(4, 3), textcoords="offset points",
                    xycoords=("axes fraction", "data"), fontsize=7, color="grey")
        ax.set_title(f"{title}: % above ILS (median over regions)")
        ax.set_xlabel("training CPU hours")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("% above ILS (negative: below)")
    axes[1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    for group in groups:
        rows = read_curve(args.state / group / "curve.csv")
        if rows:
            r = rows[-1]
            print(f"{group}: epoch {r['epoch']}, {float(r['cpu_hours']):.2f} CPU-h, greedy "
                  f"{float(r['greedy_above_ils']):+.2f} %, beam "
                  f"{float(r['beam_above_ils']):+.2f} %")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
