"""The paper's pointer network, its configuration and model files.

    from optw.model import ModelConfig, PointerNet, load_model, save_model
    model = load_model("pr01_uni_samp_500000.pt")   # authors' weights or our own files
    save_model(model, "run/model.pt", optimizer=opt.state_dict())
"""

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
