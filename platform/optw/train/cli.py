"""``optw train``: train one region (or a global model over several) with a progress bar."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model with REINFORCE",
                       description="Train the pointer network on one region (or a global model "
                       "on several) and write last.pt / best.pt / config.json to --out.")
    p.add_argument("--region", action="append", default=None,
                   help="region id (repeat for a global model over several regions); "
                   "default: the config file's regions")
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
    from optw.model import read_checkpoint
    from optw.paths import train_run_dir, write_text_atomic
    from optw.train.callbacks import Checkpointer, ProgressBar
    from optw.train.config import TrainConfig
    from optw.train.loop import check_resume, train

    overrides = {k: v for k, v in {
        "regions": args.region, "epochs": args.epochs, "seed": args.seed,
        "batch_size": args.batch_size, "tourists_per_epoch": args.tourists_per_epoch,
        "val_every": args.val_every, "checkpoint_every": args.checkpoint_every,
        "threads": args.threads, "device": args.device,
        "finetune": True if args.finetune else None,
    }.items() if v is not None}
    if args.config:
        from optw.train.config import load_mapping

        data = load_mapping(args.config)
        data = data.get("train", data)
        listed = data.get("regions")
        listed = [listed] if isinstance(listed, str) else listed
        if args.region and listed and list(listed) != args.region:
            raise ValueError(f"--region {' '.join(args.region)} differs from regions = "
                             f"{listed} in {args.config}; give one of them")
        config = TrainConfig.from_dict({**data, **overrides}, source=str(args.config))
    else:
        config = TrainConfig.from_dict(overrides, source="command line")
    if not config.regions:
        raise ValueError("--region: no region to train on (give --region R, or regions in "
                         "the --config file)")
    catalog = open_catalog(args.catalog)
    for rid in config.regions:
        catalog.region(rid)  # unknown region: clear error before anything starts
    out = args.out or train_run_dir(config.regions)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out: {out} is a file, not a folder")
    resume = None
    if args.resume:
        last = out / "last.pt"
        if not last.exists():
            raise FileNotFoundError(f"--resume: no checkpoint {last} to resume from")
        resume = read_checkpoint(last)  # read once: checked here, resumed by train()
        for key, (before, now) in check_resume(resume, config, str(last)).items():
            print(f"resuming {last} with {key} = {now!r} (it was trained with {before!r})")
    else:
        if (out / "last.pt").exists():
            raise FileExistsError(f"--out: {out} already holds a run (last.pt); continue it "
                                  "with --resume, or choose a new --out")
        if args.init is not None and not Path(args.init).is_file():
            raise FileNotFoundError(f"--init: model file {args.init} does not exist")
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "config.json", json.dumps(config.to_dict(), indent=2) + "\n")
    checkpointer = Checkpointer(out, every=config.checkpoint_every)
    result = train(config, catalog, [ProgressBar(), checkpointer], init=args.init, resume=resume)
    val = result.last_validation
    nan = float("nan")
    print(f"trained {result.epochs} epochs in {result.seconds:.1f} s; greedy validation score "
          f"{val.get('val_score', nan):.2f}, benchmark {val.get('benchmark_score', nan):.2f}; "
          f"checkpoint {checkpointer.last}")
    return 0
