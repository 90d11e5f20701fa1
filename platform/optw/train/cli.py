"""``optw train``: train one region (or a global model over several) with a progress bar."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model with REINFORCE",
                       description="Train the pointer network on one region (or a global model "
                       "on several) and write last.pt / best.pt / config.json to --out.")
    p.add_argument("--region", action="append", required=True,
                   help="region id (repeat for a global model over several regions)")
    p.add_argument("--epochs", type=int, default=None, help="REINFORCE steps (default: config)")
    p.add_argument("--config", type=Path, default=None, help="TOML/YAML/JSON TrainConfig file")
    p.add_argument("--init", type=Path, default=None,
                   help="start from these weights (ours or the authors' .pt): fine-tuning")
    p.add_argument("--finetune", action="store_true", help="fixed fine-tuning lr (1e-5)")
    p.add_argument("--resume", action="store_true",
                   help="continue from OUT/last.pt exactly where it stopped")
    p.add_argument("--out", type=Path, default=None, help="folder (default: runs/train/REGION)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--tourists-per-epoch", type=int, default=None)
    p.add_argument("--val-every", type=int, default=None)
    p.add_argument("--checkpoint-every", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--catalog", type=Path, default=None)
    p.set_defaults(func=_train)


def _train(args) -> int:
    from optw.catalog import open_catalog
    from optw.catalog.store import PROJECT_ROOT
    from optw.train.callbacks import Checkpointer, ProgressBar
    from optw.train.config import TrainConfig
    from optw.train.loop import train

    overrides = {k: v for k, v in {
        "regions": args.region, "epochs": args.epochs, "seed": args.seed,
        "batch_size": args.batch_size, "tourists_per_epoch": args.tourists_per_epoch,
        "val_every": args.val_every, "checkpoint_every": args.checkpoint_every,
        "threads": args.threads, "device": args.device,
        "finetune": True if args.finetune else None,
    }.items() if v is not None}
    if args.config:
        config = TrainConfig.from_file(args.config, **overrides)
    else:
        config = TrainConfig.from_dict(overrides, source="command line")
    catalog = open_catalog(args.catalog)
    for rid in config.regions:
        catalog.region(rid)  # unknown region: clear error before anything starts
    out = args.out or PROJECT_ROOT / "runs" / "train" / "+".join(config.regions)
    out.mkdir(parents=True, exist_ok=True)
    resume = None
    if args.resume:
        resume = out / "last.pt"
        if not resume.exists():
            raise FileNotFoundError(f"--resume: no checkpoint {resume} to resume from")
    (out / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    checkpointer = Checkpointer(out, every=config.checkpoint_every)
    result = train(config, catalog, [ProgressBar(), checkpointer], init=args.init, resume=resume)
    val = result.last_validation
    nan = float("nan")
    print(f"trained {result.epochs} epochs in {result.seconds:.1f} s; greedy validation score "
          f"{val.get('val_score', nan):.2f}, benchmark {val.get('benchmark_score', nan):.2f}; "
          f"checkpoint {checkpointer.last}")
    return 0
