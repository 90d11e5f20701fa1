"""Levers for the long pretraining run, compared along learning curves at equal CPU time.

Each variant starts from the same pretraining checkpoint's weights (``--init``, e.g. a copy of
``pretraining/gavalas/last.pt``; a fresh Adam and a 20-epoch warm-up for every variant, the
baseline included), trains the group's global model with the pretraining profile's ``[train]``
table plus the variant's changes on one thread, and every ``--every`` epochs appends a point to
``<out>/<variant>/curve.csv``: training CPU hours (the checkpoint's own included, so the points
continue its curve) and the greedy and beam-8 gaps to ILS on the profile's curve regions, as
``optw pretrain`` logs them::

    cp pretraining/gavalas/last.pt /tmp/gavalas.pt
    .venv/bin/python benchmarks/bench_levers.py --group gavalas --init /tmp/gavalas.pt \\
        --epochs 300 --every 100 --out /tmp/levers --variant base     # and the others

Variants: ``base`` (the profile as it is); ``norm`` (``advantage = "normalised"``);
``lr:X`` (constant lr X); ``tb:K:B`` (K tourists of B routes per epoch; compare at equal CPU,
not epochs); ``demo:N`` (``demo_tourists`` from N ILS demonstrations per region: each epoch's
tourists are demonstrations', whose ILS route joins the sampled routes and their baseline, so
the better of the model's routes and ILS's is reinforced; computing the demonstrations is not
counted). Prints the last point as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def changes_of(variant: str) -> dict:
    kind, *arg = variant.split(":")
    if kind == "base":
        return {}
    if kind == "norm":
        return {"advantage": "normalised"}
    if kind == "lr":
        return {"lr": float(arg[0])}
    if kind == "tb":
        return {"tourists_per_epoch": int(arg[0]), "batch_size": int(arg[1])}
    if kind == "demo":
        return {"demos": int(arg[0]), "demo_tourists": True}
    raise SystemExit(f"unknown variant {variant!r}: base, norm, lr:X, tb:K:B or demo:N")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--group", required=True)
    p.add_argument("--init", required=True, help="a pretraining checkpoint (last.pt)")
    p.add_argument("--variant", default="base")
    p.add_argument("--epochs", type=int, default=300)
    p.add_argument("--every", type=int, default=100)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--catalog", default=None)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "platform"))
    import dataclasses

    import torch

    from optw.catalog import open_catalog
    from optw.distributed.pretrain import (
        PretrainProgress,
        gaps_above_ils,
        group_regions,
        ils_means,
        load_pretrain_profile,
    )
    from optw.model import read_checkpoint
    from optw.train import TrainConfig, train

    torch.set_num_threads(1)
    catalog = open_catalog(args.catalog)
    table, settings = load_pretrain_profile()
    start = read_checkpoint(args.init)["pretrain"]
    regions = settings.curve_regions[args.group]
    ils = ils_means(catalog, regions, settings.curve_tourists)
    config = TrainConfig.from_dict({
        **table, **changes_of(args.variant), "regions": group_regions(catalog, args.group),
        "epochs": args.epochs, "warmup_epochs": 20, "val_every": 0, "checkpoint_every": 0,
        "val_tourists": 4}, source=f"variant {args.variant}")
    out = args.out / args.variant.replace(":", "_")
    out.mkdir(parents=True, exist_ok=True)
    (out / "curve.csv").unlink(missing_ok=True)
    tracker = PretrainProgress(
        out, dataclasses.replace(settings, curve_every=args.every, checkpoint_every=10**9),
        float("inf"), lambda m: gaps_above_ils(m, catalog, regions, ils,
                                               settings.curve_tourists, settings.beams),
        config.batch_size * config.tourists_per_epoch, {"cpu_s": start["cpu_s"]})
    train(config, catalog, callbacks=[tracker], init=args.init)
    last = (out / "curve.csv").read_text().splitlines()
    print(json.dumps({"variant": args.variant, "from_epoch": start["epoch"],
                      "header": last[0], "last": last[-1]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
