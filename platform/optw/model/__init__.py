"""The paper's pointer network, its configuration and model files.

    from optw.model import ModelConfig, PointerNet, load_model, save_model
    model = load_model("pr01_uni_samp_500000.pt")   # authors' weights or our own files
    save_model(model, "run/model.pt", optimizer=opt.state_dict())
"""

from optw.model.checkpoint import (
    CHECK_ENV,
    FORMAT,
    FORMAT_VERSION,
    CheckpointError,
    check_plain,
    checkpoint_dict,
    convert_published,
    is_published_state_dict,
    load_model,
    model_from_state_dict,
    read_checkpoint,
    save_model,
    write_checkpoint,
)
from optw.model.config import ModelConfig
from optw.model.network import EncoderLayer, PointerNet, heads_to_linear

__all__ = [
    "CHECK_ENV", "check_plain", "write_checkpoint",
    "FORMAT", "FORMAT_VERSION", "CheckpointError", "EncoderLayer", "ModelConfig", "PointerNet",
    "checkpoint_dict", "convert_published", "heads_to_linear", "is_published_state_dict",
    "load_model", "model_from_state_dict", "read_checkpoint", "save_model",
]
