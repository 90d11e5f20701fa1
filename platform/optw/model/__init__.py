"""The paper's pointer network, its configuration and model files (docs/model.md)."""

from optw.model.checkpoint import (
    CHECK_ENV,
    CheckpointError,
    checkpoint_dict,
    load_model,
    read_checkpoint,
    save_model,
    write_checkpoint,
)
from optw.model.config import ModelConfig
from optw.model.network import PointerNet

__all__ = [
    "CHECK_ENV", "CheckpointError", "ModelConfig", "PointerNet", "checkpoint_dict", "load_model",
    "read_checkpoint", "save_model", "write_checkpoint",
]
