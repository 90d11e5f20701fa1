"""REINFORCE training (the paper's Algorithm 1), its parameters and callbacks."""

from optw.train.callbacks import (
    Callback,
    Checkpointer,
    EarlyStopping,
    MetricsHistory,
    ProgressBar,
    TrainContext,
)
from optw.train.config import TrainConfig


def __getattr__(name: str):
    # The loop imports torch and the model; load it only when asked for.
    if name in ("train", "validate", "TrainResult", "resolve_device"):
        from optw.train import loop

        return getattr(loop, name)
    raise AttributeError(name)


__all__ = [
    "Callback", "Checkpointer", "EarlyStopping", "MetricsHistory", "ProgressBar",
    "TrainConfig", "TrainContext", "TrainResult", "resolve_device",
    "train", "validate",
]
