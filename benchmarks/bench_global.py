"""A group's global model (the `quick` profile's [train] table), variants side by side.

Trains the group's global model with ``--epochs`` REINFORCE epochs (one thread) and a variant,
then greedy and beam-8 on the validation tourists of ``--eval`` regions, against the stored ILS
means. Prints one JSON line: CPU seconds (demonstrations' ILS, training), epochs, per-region
gaps and their medians::

    .venv/bin/python benchmarks/bench_global.py --group gavalas --eval t101,t131,t208,t250 \\
        --variant rl            # also dt:128 and imit:64:40:1e-3

Variants: ``rl`` (as `quick`); ``dt:D`` (REINFORCE epochs on D demonstration tourists per
region with their ILS routes); ``imit:D:S:LR[:B]`` (S imitation steps of B (32) of D
demonstrations per region at LR, then the REINFORCE epochs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICK = {"recipe": "fast", "mix_regions": True, "tourists_per_epoch": 8, "batch_size": 16,
         "warmup_epochs": 20, "lr_schedule": "cosine", "val_every": 0, "val_tourists": 4,
         "checkpoint_every": 0, "threads": 1, "device": "cpu", "seed": 2925}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--group", required=True)
    p.add_argument("--eval", required=True, help="comma-separated regions evaluated")
    p.add_argument("--variant", default="rl")
    p.add_argument("--epochs", type=int, default=130)
    p.add_argument("--catalog", default=None)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "platform"))
    import numpy as np
    import torch

    from optw.baselines.demos import get_demos
    from optw.catalog import open_catalog
    from optw.distributed.pretrain import gaps_above_ils
    from optw.evaluate.protocol import ils_validation_means
    from optw.train import TrainConfig, train

    torch.set_num_threads(1)
    catalog = open_catalog(args.catalog)
    table = catalog.regions_table
    regions = list(table.index[table["group"] == args.group])
    evals = args.eval.split(",")
    ils = ils_validation_means(str(catalog.path), evals, 64)
    kind, *arg = args.variant.split(":")
    changes = ({} if kind == "rl" else {"demos": int(arg[0]), "demo_tourists": True}
               if kind == "dt" else {"demos": int(arg[0]), "imitation_epochs": int(arg[1]),
                                     "imitation_lr": float(arg[2]),
                                     "imitation_batch": int(arg[3]) if len(arg) > 3 else 32})
    config = TrainConfig.from_dict({**QUICK, **changes, "regions": regions,
                                    "epochs": args.epochs})
    demos, demo_s = None, 0.0
    if config.demos:
        t0 = time.process_time()
        demos = get_demos(catalog, regions, config.demos, config.seed)
        demo_s = time.process_time() - t0
    t0 = time.process_time()
    result = train(config, catalog, demos=demos)
    train_s = time.process_time() - t0
    gaps = gaps_above_ils(result.model, catalog, evals, ils, 64, 8)
    print(json.dumps({"group": args.group, "variant": args.variant, "demo_s": demo_s,
                      "train_s": train_s, "epochs": result.epochs, "gaps": gaps,
                      "median_beam": float(np.median([g["beam"] for g in gaps.values()])),
                      "median_greedy": float(np.median([g["greedy"] for g in gaps.values()]))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
