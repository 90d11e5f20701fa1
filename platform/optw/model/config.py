"""Model hyper-parameters."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from optw.checks import integer, number, require
from optw.env.instances import N_DYNAMIC, N_STATIC
from optw.env.state import GRAPHS
from optw.errors import ConfigError

#: Upper bounds of the sizes (a typo such as d_model = 1280000 would allocate for minutes).
MAX_D_MODEL, MAX_D_FF, MAX_LAYERS = 8192, 65536, 64


@dataclass(frozen=True)
class ModelConfig:
    """The paper's pointer network; defaults are the published architecture (``recursion`` and
    ``graph``: docs/model.md)."""

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
        """Every value checked, sizes before their ratios; :class:`ConfigError` names the key."""
        for name, hi in (("d_model", MAX_D_MODEL), ("n_heads", MAX_D_MODEL),
                         ("n_layers", MAX_LAYERS), ("d_ff", MAX_D_FF)):
            v = getattr(self, name)
            require(integer(v) and 1 <= v <= hi, name, v, f"must be an integer in 1..{hi}")
        for name in ("n_static", "n_dynamic"):
            require(integer(getattr(self, name)), name, getattr(self, name),
                    "must be an integer")
        require(self.d_model % self.n_heads == 0 and self.d_model % 2 == 0, "d_model",
                self.d_model, f"must be even and divisible by n_heads = {self.n_heads}")
        require(number(self.clip) and self.clip > 0, "clip", self.clip,
                "must be a finite number > 0")
        require(type(self.recursion) is bool, "recursion", self.recursion,
                "must be true or false")
        require(self.graph in GRAPHS, "graph", self.graph,
                f"unknown graph; expected one of {GRAPHS}")
        if (self.n_static, self.n_dynamic) != (N_STATIC, N_DYNAMIC):
            raise ConfigError(
                f"n_static = {self.n_static}, n_dynamic = {self.n_dynamic}: the environment "
                f"provides {N_STATIC} static and {N_DYNAMIC} dynamic features", "n_static")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown model config field(s) {unknown}; known: "
                              f"{sorted(known)}", unknown[0])
        return cls(**values)
