"""Model files (docs/model.md): our own format, written by :func:`write_checkpoint` only, and
an importer for the authors' published weights (bare state dicts of their ``RecPointerNetwork``,
``shared/spec/published-checkpoints.md``); everything is read with ``weights_only=True``.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from optw.errors import UserError
from optw.model.config import ModelConfig
from optw.model.network import PointerNet, heads_to_linear
from optw.paths import replace_atomic

FORMAT = "optw-model"
FORMAT_VERSION = 1


class CheckpointError(UserError):
    """A file that is not a readable model checkpoint of this architecture."""


#: Set (to anything but "" or "0") to make every :func:`write_checkpoint` also prove that
#: ``torch.load(weights_only=True)`` reads its object back; the test suite sets it.
CHECK_ENV = "OPTW_CHECK_CHECKPOINTS"

_PLAIN = (bool, int, float, complex, str, bytes, type(None))
_LEAVES = (torch.Tensor, torch.dtype, torch.device, torch.Size)


def check_plain(obj: Any, where: str = "") -> None:
    """``TypeError`` naming the first value ``torch.load(weights_only=True)`` would refuse."""
    if isinstance(obj, _LEAVES) or type(obj) in _PLAIN:  # exact: np.float64 is a float
        return
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            if type(key) not in _PLAIN:
                raise TypeError(f"{where or 'checkpoint'}: key {key!r} is a "
                                f"{type(key).__module__}.{type(key).__qualname__}")
            check_plain(value, f"{where}.{key}" if where else str(key))
    elif type(obj) in (list, tuple, set):
        for i, value in enumerate(obj):
            check_plain(value, f"{where}[{i}]")
    else:
        raise TypeError(f"{where or 'checkpoint'} is a {type(obj).__module__}."
                        f"{type(obj).__qualname__}; a checkpoint holds only tensors and plain "
                        "Python values (convert it where it is made)")


def write_checkpoint(obj: Mapping[str, Any], path: str | Path) -> Path:
    """The one writer of model files, training snapshots and Ray Train checkpoints: checks the
    object is plain and replaces ``path`` atomically (:data:`CHECK_ENV`: and proves it loads)."""
    check_plain(obj)
    buf = io.BytesIO()
    torch.save(obj, buf)
    if os.environ.get(CHECK_ENV, "") not in ("", "0"):
        buf.seek(0)
        torch.load(buf, map_location="cpu", weights_only=True)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return replace_atomic(path, lambda tmp: tmp.write_bytes(buf.getvalue()))


def _numpy_scalar_globals() -> list:
    """The only globals a checkpoint may name: what a pickled numpy number needs."""
    import numpy as np

    try:
        from numpy._core.multiarray import scalar
    except ImportError:  # numpy 1.x names the module numpy.core
        from numpy.core.multiarray import scalar  # type: ignore[no-redef]
    kinds = [np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8,
             np.uint64, np.uint32, np.uint16, np.uint8, np.bool_]
    return [scalar, np.dtype, *{type(np.dtype(k)) for k in kinds}]


def _to_plain(obj: Any) -> Any:
    """numpy scalars anywhere in containers -> Python numbers (everything else unchanged)."""
    import numpy as np

    if isinstance(obj, dict):
        return type(obj)((k, _to_plain(v)) for k, v in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(_to_plain(v) for v in obj)
    return obj.item() if isinstance(obj, np.generic) else obj


def read_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(weights_only=True)``, numpy numbers returned as Python numbers; unreadable
    files raise :class:`CheckpointError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        with torch.serialization.safe_globals(_numpy_scalar_globals()):
            obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # corrupt, truncated, not a torch file, unsafe pickle
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        why = lines[0] if lines else type(exc).__name__
        if "weights_only" in why or "Weights only load failed" in why:
            why = ("not a torch state file, or one holding objects other than tensors and "
                   "plain data; re-create it with this version (e.g. `optw train`)")
        raise CheckpointError(f"cannot read checkpoint {path}: {why}") from exc
    return _to_plain(obj)


def convert_published(sd: Mapping[str, torch.Tensor]) -> tuple[ModelConfig, dict]:
    """The authors' state dict -> (config, our state dict); :class:`CheckpointError` if it is
    of another architecture."""
    try:
        n_layers = 1 + max(int(m.group(1)) for k in sd
                           if (m := re.match(r"encoder\.layers\.(\d+)\.", k)))
        n_heads, d_model, _ = sd["encoder.layers.0.enc_self_attn.attention.w_q"].shape
        d_ff = sd["encoder.layers.0.pos_ffn.w_1.weight"].shape[0]
        n_static = sd["encoder.L1.weight"].shape[1]
        n_dynamic = sd["encoder.L2.weight"].shape[1]
    except (KeyError, ValueError, AttributeError) as exc:
        raise CheckpointError("not the authors' recursive pointer network (missing or odd "
                              f"entry: {exc})") from exc
    try:
        cfg = ModelConfig(d_model=int(d_model), n_heads=int(n_heads), n_layers=n_layers,
                          d_ff=int(d_ff), n_static=int(n_static), n_dynamic=int(n_dynamic))
    except ValueError as exc:
        raise CheckpointError(f"incompatible published checkpoint: {exc}") from exc
    src = dict(sd)

    def take(name: str) -> torch.Tensor:
        if name not in src:
            raise CheckpointError(f"not the published architecture: missing {name!r}")
        return src.pop(name)

    out = {f"{ours}_embed.{p}": take(f"encoder.{theirs}.{p}")
           for ours, theirs in (("static", "L1"), ("dynamic", "L2")) for p in ("weight", "bias")}
    for i in range(cfg.n_layers):
        a, f = f"encoder.layers.{i}.enc_self_attn.", f"encoder.layers.{i}.pos_ffn."
        wq, wk, wv = (take(f"{a}attention.w_{c}") for c in "qkv")
        for w, c in ((wq, "q"), (wk, "k"), (wv, "v")):
            if w.dim() != 3 or w.shape[0] != cfg.n_heads:
                raise CheckpointError(f"{a}attention.w_{c} has shape {tuple(w.shape)}")
        out[f"layers.{i}.qv.weight"] = torch.cat([heads_to_linear(wq), heads_to_linear(wv)])
        out[f"layers.{i}.k.weight"] = heads_to_linear(wk)
        for ours, theirs in (("out", a + "proj"), ("norm1", a + "layer_norm"), ("ff1", f + "w_1"),
                             ("ff2", f + "w_2"), ("norm2", f + "layer_norm")):
            for p in ("weight", "bias"):
                out[f"layers.{i}.{ours}.{p}"] = take(f"{theirs}.{p}")
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        out[f"lstm.{name}"] = take(f"decoder.lstm.{name}")
    for ours, theirs in (("h0", "first_h_0"), ("c0", "c0"), ("ptr_ref.weight", "W1.weight"),
                         ("ptr_query.weight", "W2.weight"), ("ptr_query.bias", "W2.bias"),
                         ("ptr_v", "V")):
        out[ours] = take(f"decoder.{theirs}")
    if src:
        raise CheckpointError(f"not the published architecture: unexpected {sorted(src)[:5]}")
    return cfg, out


def model_from_state_dict(cfg: ModelConfig, state_dict: Mapping[str, torch.Tensor],
                          path: str | Path) -> PointerNet:
    """A :class:`PointerNet` with these weights (:class:`CheckpointError` naming ``path`` if
    they misfit)."""
    model = PointerNet(cfg)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not fit the model: missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]}")
    for name, value in state_dict.items():
        if not isinstance(value, torch.Tensor) or value.shape != expected[name].shape:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value)
            raise CheckpointError(f"{path}: {name} has shape {shape}, the model expects "
                                  f"{tuple(expected[name].shape)}")
        if not torch.isfinite(value).all():
            raise CheckpointError(f"{path}: {name} holds non-finite values (corrupt checkpoint?)")
    model.load_state_dict(state_dict)
    return model


def load_model(path: str | Path, map_location: str | torch.device = "cpu") -> PointerNet:
    """Read a model from our format or from the authors' ``.pt`` state dict, in eval mode."""
    obj = read_checkpoint(path, map_location)
    if isinstance(obj, Mapping) and obj.get("format") == FORMAT:
        version = obj.get("version", FORMAT_VERSION)
        if version > FORMAT_VERSION:
            raise CheckpointError(f"{path}: format version {version} is newer than this code "
                                  f"({FORMAT_VERSION})")
        try:
            cfg = ModelConfig.from_dict(dict(obj["config"]))
            state_dict = obj["state_dict"]
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{path}: bad optw-model checkpoint ({exc})") from exc
    elif isinstance(obj, Mapping) and obj and all(  # the authors' bare state dict
            isinstance(k, str) and k.startswith(("encoder.", "decoder.")) for k in obj):
        cfg, state_dict = convert_published(obj)
    else:
        kind = type(obj).__name__
        keys = f" with keys {sorted(map(str, obj))[:5]}" if isinstance(obj, Mapping) else ""
        raise CheckpointError(f"{path} is not an OPTW model checkpoint (a {kind}{keys}); expected "
                              "our 'optw-model' format or the authors' published state dict")
    model = model_from_state_dict(cfg, state_dict, path)
    train = obj.get("train")  # None: published weights
    regions = train.get("regions") if isinstance(train, Mapping) else None
    model.trained_on = tuple(str(r) for r in regions) if regions else None
    return model.to(map_location).eval()


def checkpoint_dict(model: PointerNet, **extra: Any) -> dict:
    """Our checkpoint dict for ``model`` (extra keys, e.g. ``optimizer``, are kept)."""
    if reserved := {"format", "version", "config", "state_dict"} & set(extra):
        raise ValueError(f"extra keys {sorted(reserved)} are reserved")
    return {"format": FORMAT, "version": FORMAT_VERSION, "config": model.cfg.to_dict(),
            "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}, **extra}


def save_model(model: PointerNet, path: str | Path, **extra: Any) -> Path:
    """Write ``model`` (plus ``extra`` keys) in our format; returns the path."""
    return write_checkpoint(checkpoint_dict(model, **extra), path)
