"""``optw train``: train one region (or a global model over several) with a progress bar."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from optw.train.rollouts import ROLLOUTS


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
                   help="continue from OUT/last.pt exactly where it stopped, with its own "
                   "settings (options given now override them where a resume allows)")
    p.add_argument("--out", type=Path, default=None, help="folder (default: runs/train/REGION)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the weights and of training, 0..4294967295 (default: config)")
    for option in ("--batch-size", "--tourists-per-epoch", "--val-every", "--checkpoint-every"):
        p.add_argument(option, type=int, default=None)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads, 1..256 (default: the cores not busy with other work, "
                   "see optw.threads)")
    p.add_argument("--device", default=None,
                   help="auto (default: cuda when available), cpu, cuda or cuda:N")
    p.add_argument("--rollout", default=None, choices=ROLLOUTS,
                   help="the training rollout (default: auto, static on CUDA, compact "
                   "elsewhere); graph replays each epoch as a CUDA graph (CUDA only, another "
                   "random stream; docs/gpu.md)")
    p.add_argument("--patience", type=int, default=None, metavar="N",
                   help="stop after N validations without a better validation score")
    p.add_argument("--catalog", type=Path, default=None)
    p.set_defaults(func=_train)


#: TrainConfig key -> the ``optw train`` option that sets it (its value: the option's
#: attribute of the parsed arguments, unless None or False).
OPTIONS = {"regions": "--region", "epochs": "--epochs", "seed": "--seed",
           "batch_size": "--batch-size", "tourists_per_epoch": "--tourists-per-epoch",
           "val_every": "--val-every", "checkpoint_every": "--checkpoint-every",
           "threads": "--threads", "device": "--device", "finetune": "--finetune",
           "rollout": "--rollout"}


def _config(args, base: dict | None = None):
    """The run's :class:`TrainConfig`: ``base`` (a resumed run's own settings), then
    ``--config``, then the options; a ``ConfigError`` names the option (``--seed -5: ...``) or
    the file and the key (``cfg.toml: model.d_model = 0: ...``)."""
    from optw.checks import load_mapping
    from optw.errors import ConfigError, UserError
    from optw.train.config import TrainConfig

    given = {k: getattr(args, opt[2:].replace("-", "_")) for k, opt in OPTIONS.items()}
    overrides = {k: v for k, v in given.items() if v is not None and v is not False}
    data, source = {}, "command line"
    if args.config:
        data = load_mapping(args.config)
        data = data.get("train", data)
        source = str(args.config)
        listed = data.get("regions")
        listed = [listed] if isinstance(listed, str) else listed
        if args.region and listed and list(listed) != args.region:
            raise UserError(f"--region {' '.join(args.region)} differs from regions = "
                            f"{listed} in {args.config}; give one of them")
    try:
        return TrainConfig.from_dict({**(base or {}), **data, **overrides}, source=source)
    except ConfigError as exc:
        if exc.key in overrides and exc.key in OPTIONS:
            # "SOURCE: seed = -5: must be ..." -> "--seed -5: must be ..."
            detail = str(exc).split(f"{exc.key} = ", 1)[-1]
            raise ConfigError(f"{OPTIONS[exc.key]} {detail}", exc.key) from None
        raise


def _check_device(config, args) -> None:
    """The run's device and rollout against this machine's CUDA devices (before anything is
    written), naming the option or the file that asked for them."""
    import torch

    from optw.train.config import check_devices

    asked = {"device": args.device, "rollout": args.rollout}
    given = next((k for k in ("device", "rollout") if asked[k] is not None), None)
    where = (f"--{given} {asked[given]}" if given else
             str(args.config) if args.config else "the checkpoint")
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    check_devices(config, cuda, where)


#: The marker of an ``optw train`` folder (:mod:`optw.outdir`); and what such a folder held
#: before markers existed.
KIND, LEGACY = "train", frozenset({"config.json", "last.pt", "best.pt"})


def _demonstrations(config, catalog, done: int) -> dict | None:
    """The run's demonstrations (None when it learns from none), the missing ones computed
    now with a line and a progress bar saying so (ILS routes: minutes for many)."""
    from optw.baselines.demos import get_demos

    if not config.demos or (done >= config.imitation_epochs and not config.demo_tourists):
        return None
    print(f"demonstrations: {config.demos} ILS routes per region ({len(config.regions)} "
          "region(s)); those the catalog does not store yet are computed now", flush=True)
    return get_demos(catalog, config.regions, config.demos, config.seed, config.score_kind,
                     progress=True)


def _train(args) -> int:
    from optw.catalog import open_catalog
    from optw.errors import UserError
    from optw.model import read_checkpoint
    from optw.outdir import check_out_dir, marker, write_marker
    from optw.paths import train_run_dir, write_text_atomic
    from optw.threads import set_torch_threads
    from optw.train.callbacks import Checkpointer, EarlyStopping, ProgressBar
    from optw.train.config import ADDED_DEFAULTS, check_fits
    from optw.train.loop import check_resume, train

    # every check first: a refused run writes nothing (no folder, no config.json)
    config = _config(args)
    resume, done = None, 0
    out = args.out or (train_run_dir(config.regions) if config.regions else None)
    if args.resume:
        if out is None:
            raise UserError("--resume: give --out (the run's folder) or --region")
        last = out / "last.pt"
        if not last.is_file():
            raise UserError(f"--resume: no checkpoint {last} to resume from")
        resume = read_checkpoint(last)  # read once: checked here, resumed by train()
        if "train" not in resume:
            raise UserError(f"--resume: {last} is a model file, not a training checkpoint")
        # the run goes on with its own settings, but for those given now
        config = _config(args, {**ADDED_DEFAULTS, **resume["train"].get("config", {})})
    if not config.regions:
        raise UserError("--region: no region to train on (give --region R, or regions in "
                        "the --config file)")
    if args.patience is not None and args.patience < 1:
        raise UserError(f"--patience {args.patience}: give a number of validations >= 1")
    _check_device(config, args)
    catalog = open_catalog(args.catalog)
    nodes = max(catalog.region(rid).n_nodes for rid in config.regions)  # unknown: named
    check_fits(config, nodes, "--batch-size × --tourists-per-epoch")
    check_out_dir(out, KIND, LEGACY, option="--out")  # never into a folder of other files
    if resume is not None:
        for key, (before, now) in check_resume(resume, config, str(last)).items():
            print(f"resuming {last} with {key} = {now!r} (it was trained with {before!r})")
        done = int(resume["train"]["epoch"])
        if done >= config.total_epochs:
            print(f"nothing to train: {last} already holds {done} epochs (the run's "
                  f"{config.total_epochs}); give a larger --epochs to train more")
            return 0
    else:
        if (out / "last.pt").exists():
            raise UserError(f"--out: {out} already holds a run (last.pt); continue it "
                            "with --resume, or choose a new --out")
        if args.init is not None and not Path(args.init).is_file():
            raise UserError(f"--init: model file {args.init} does not exist")
    if config.threads is None:
        set_torch_threads(None)  # the cores other work leaves free, not torch's core count
    created = not out.exists()
    config_file = out / "config.json"
    had_config = config_file.exists()
    out.mkdir(parents=True, exist_ok=True)
    write_marker(out, KIND, LEGACY)
    write_text_atomic(config_file, json.dumps(config.to_dict(), indent=2) + "\n")
    checkpointer = Checkpointer(out, every=config.checkpoint_every)
    callbacks = [ProgressBar(), checkpointer]
    if args.patience:
        callbacks.append(EarlyStopping(args.patience))
    try:
        demos = _demonstrations(config, catalog, done)
        result = train(config, catalog, callbacks, init=args.init, resume=resume, demos=demos)
    except BaseException:
        # a run that failed before its first checkpoint leaves nothing behind
        if not (out / "last.pt").exists():
            if not had_config:
                config_file.unlink(missing_ok=True)
            if created:
                (out / marker(KIND)).unlink(missing_ok=True)
                if not any(out.iterdir()):
                    out.rmdir()
        raise
    val, nan, trained = result.last_validation, float("nan"), result.epochs - done
    what = (f"trained {trained} more epochs ({result.epochs} in all)" if done
            else f"trained {trained} epochs")
    stopped = f" (stopped at {result.epochs} of {config.total_epochs})" if (
        result.epochs < config.total_epochs) else ""
    print(f"{what}{stopped} in {result.seconds:.1f} s; greedy validation score "
          f"{val.get('val_score', nan):.2f}, benchmark {val.get('benchmark_score', nan):.2f}; "
          f"checkpoint {checkpointer.last}")
    return 0
