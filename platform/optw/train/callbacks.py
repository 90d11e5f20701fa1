"""Training callbacks: logging, checkpointing and early stopping live outside the loop.

The loop in :mod:`optw.train.loop` calls every hook of every callback in order; a callback
that wants the run to end sets ``ctx.stop = True``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TrainContext:
    """What the loop shares with callbacks (read-only except ``stop`` and ``extra``)."""

    region_ids: list[str]
    config: Any  # TrainConfig
    epoch: int = 0  # epochs (REINFORCE steps) completed
    total_epochs: int = 0
    stop: bool = False
    best_validation: float | None = None
    last_validation: dict[str, float] = field(default_factory=dict)
    last_checkpoint: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Callback:
    """Base class; override the hooks you need."""

    def on_train_start(self, ctx: TrainContext) -> None: ...

    def on_epoch_end(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        """After each epoch: mean_reward, loss, entropy, lr, epochs_per_s (smoothed)."""

    def on_validation(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        """After greedy validation: val_score (mean over validation tourists),
        benchmark_score, val_seconds."""

    def on_checkpoint(self, ctx: TrainContext, path: Path) -> None: ...

    def on_train_end(self, ctx: TrainContext) -> None: ...
