"""Training callbacks (progress, metrics, checkpoints, early stopping): the loop calls every
hook of every callback in order; a callback ends the run by setting ``ctx.stop = True``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TrainContext:
    """What the loop shares with callbacks (read-only except ``stop``)."""

    region_ids: list[str]
    config: Any  # TrainConfig
    epoch: int = 0  # epochs (REINFORCE steps) completed
    total_epochs: int = 0
    stop: bool = False
    best_validation: float | None = None
    last_validation: dict[str, float] = field(default_factory=dict)
    last_checkpoint: Path | None = None
    #: The full training state as a checkpoint dict (set by the loop).
    snapshot: Callable[[], dict] | None = None


class Callback:
    """Base class; override the hooks you need."""

    def on_train_start(self, ctx: TrainContext) -> None: ...

    def on_epoch_end(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        """After each epoch: mean_reward, loss, entropy, lr, epochs_per_s (smoothed)."""

    def on_validation(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        """After greedy validation: val_score (mean over validation tourists),
        benchmark_score, val_seconds."""

    def on_train_end(self, ctx: TrainContext) -> None: ...


class ProgressBar(Callback):
    """A tqdm bar: epochs/s, mean reward (or imitation loss), the latest validation score (at
    the end: the run's last, as its result reports it)."""

    bar: Any = None
    post: dict[str, str]

    def __init__(self, desc: str | None = None):
        self.desc = desc  # the bar's label (default: the first regions' ids)

    def on_train_start(self, ctx: TrainContext) -> None:
        from tqdm import tqdm

        desc = self.desc or (",".join(ctx.region_ids[:3])
                             + ("…" if len(ctx.region_ids) > 3 else ""))
        self.bar = tqdm(total=ctx.total_epochs, initial=ctx.epoch, desc=desc, unit="epoch",
                        dynamic_ncols=True)
        self.post = {}

    def _show(self, ctx: TrainContext) -> None:
        if ctx.last_validation:
            self.post["val"] = f"{ctx.last_validation['val_score']:.2f}"
        self.bar.n = ctx.epoch
        self.bar.set_postfix(self.post, refresh=False)
        self.bar.refresh()

    def on_epoch_end(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        self.post = ({"reward": f"{metrics['mean_reward']:.1f}"} if "mean_reward" in metrics
                     else {"imitation": f"{metrics['imitation_loss']:.3f}"})
        self._show(ctx)

    def on_validation(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        self._show(ctx)

    def on_train_end(self, ctx: TrainContext) -> None:
        self._show(ctx)
        self.bar.close()


class EarlyStopping(Callback):
    """Stop when the validation score has not improved for ``patience`` validations."""

    def __init__(self, patience: int):
        self.patience, self.bad = patience, 0
        self.best: float | None = None

    def on_validation(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        score = metrics["val_score"]
        if self.best is None or score > self.best:
            self.best, self.bad = score, 0
        else:
            self.bad += 1
            if self.bad >= self.patience:
                ctx.stop = True


class MetricsHistory(Callback):
    """Keeps every epoch's and validation's metrics in memory (tests, reports)."""

    def __init__(self):
        self.epochs: list[dict[str, float]] = []
        self.validations: list[dict[str, float]] = []

    def on_epoch_end(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        self.epochs.append({"epoch": ctx.epoch, **metrics})

    def on_validation(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        self.validations.append({"epoch": ctx.epoch, **metrics})


class Checkpointer(Callback):
    """Writes ``last.pt`` every ``every`` epochs and at the end, and ``best.pt`` on a new best
    validation score. ``last.pt`` resumes the run exactly (see :func:`optw.train.train`)."""

    def __init__(self, folder: str | Path, every: int = 0, keep_best: bool = True):
        self.every, self.keep_best = every, keep_best
        self.last, self.best = Path(folder) / "last.pt", Path(folder) / "best.pt"

    def _save(self, ctx: TrainContext, path: Path, last: bool = True) -> None:
        from optw.model import write_checkpoint  # torch only where checkpoints are written

        assert ctx.snapshot is not None, "the training loop sets ctx.snapshot"
        write_checkpoint(ctx.snapshot(), path)
        if last:
            ctx.last_checkpoint = path

    def on_epoch_end(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        if self.every and ctx.epoch % self.every == 0:
            self._save(ctx, self.last)

    def on_validation(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        if self.keep_best and ctx.best_validation == metrics["val_score"]:
            self._save(ctx, self.best, last=False)

    def on_train_end(self, ctx: TrainContext) -> None:
        self._save(ctx, self.last)
