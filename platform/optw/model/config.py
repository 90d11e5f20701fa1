"""Model hyper-parameters."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from optw.env.instances import N_DYNAMIC, N_STATIC
from optw.env.state import GRAPHS


@dataclass(frozen=True)
class ModelConfig:
    """The paper's pointer network; defaults are the published architecture.

    ``recursion``: attention keys come from the previous decoding step's final encoder output
    (the paper's "transformer with recursion"); False gives a vanilla transformer whose keys come
    from each layer's input. ``graph``: attention masked by the ``"lookahead"`` graph Ad, or by
    the ``"complete"`` graph over the admissible nodes.
    """

    d_model: int = 128
    n_heads: int = 8
    n_layers: int = 2
    d_ff: int = 256
    clip: float = 10.0  # C in C*tanh(u)
    recursion: bool = True
    graph: str = "lookahead"
    n_static: int = N_STATIC
    n_dynamic: int = N_DYNAMIC

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_layers", "d_ff", "n_static", "n_dynamic"):
            if type(getattr(self, name)) is not int:
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if type(self.clip) not in (int, float) or not 0 < self.clip < math.inf:
            raise ValueError(f"clip must be a finite number > 0, got {self.clip!r}")
        if type(self.recursion) is not bool:
            raise ValueError(f"recursion must be true or false, got {self.recursion!r}")
        if self.graph not in GRAPHS:
            raise ValueError(f"unknown graph {self.graph!r}; expected one of {GRAPHS}")
        if self.d_model % self.n_heads or self.d_model % 2:
            raise ValueError(
                f"d_model {self.d_model} must be even and divisible by n_heads {self.n_heads}"
            )
        if (self.n_static, self.n_dynamic) != (N_STATIC, N_DYNAMIC):
            raise ValueError(
                f"the environment provides {N_STATIC} static and {N_DYNAMIC} dynamic features, "
                f"not {self.n_static} and {self.n_dynamic}"
            )
        for name in ("n_heads", "n_layers", "d_ff"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown model config field(s) {unknown}")
        return cls(**values)
