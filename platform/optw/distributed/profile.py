"""Job profiles: what the platform job trains, fine-tunes and evaluates, loaded from TOML/YAML.

A profile has four tables: ``[job]`` (name, mode, groups, regions), ``[train]`` (a
:class:`~optw.train.TrainConfig` for scratch and global models), ``[finetune]`` (overrides of
``[train]`` for fine-tuning stages), ``[evaluate]`` and ``[resources]``. ``smoke`` and ``paper``
ship with the package (``optw/distributed/profiles/``); copy one to make your own.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from optw.catalog import GROUPS
from optw.evaluate.protocol import EvaluateSettings
from optw.train.config import (
    ConfigError,
    TrainConfig,
    from_table,
    integer,
    load_mapping,
    number,
)

PROFILE_DIR = Path(__file__).with_name("profiles")
MODES = ("scratch", "global-ft", "transfer")
PACK_MODES = ("sequential", "batched")


@dataclass
class JobSection:
    name: str = "optw"
    mode: str = "scratch"
    groups: list[str] = field(default_factory=lambda: list(GROUPS))
    regions: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("groups", "regions"):
            value = getattr(self, name)
            if not (isinstance(value, list) and all(isinstance(v, str) and v for v in value)):
                raise ConfigError(f"job.{name} = {value!r}: must be a list of names")
        if self.mode not in MODES:
            raise ConfigError(f"job.mode = {self.mode!r}: expected one of {list(MODES)}")
        bad = sorted(set(self.groups) - set(GROUPS))
        if bad or not self.groups:
            raise ConfigError(f"job.groups = {self.groups!r}: unknown group(s) {bad}; "
                              f"expected some of {list(GROUPS)}")
        if not isinstance(self.name, str) or not self.name or any(c in self.name for c in "/\\ "):
            raise ConfigError(f"job.name = {self.name!r}: must be a non-empty word")


@dataclass
class ResourcesSection:
    cpus_per_region: float = 1.0  # per Ray Train worker (one pack of regions)
    gpu_fraction: float = 0.25
    max_failures: int = 2
    #: regions one Ray Train worker trains one after another (a pack): 1 for long budgets on
    #: a cluster (each region its own actor, restarted alone); more for short budgets, where
    #: starting a worker costs more than training a region
    regions_per_worker: int = 1
    #: how a worker trains its pack: "sequential" (one region after another) or "batched"
    #: (side by side in one batched step, weights stacked per region; same models, within
    #: rounding); packs that cannot batch (global models, mixed model shapes) go one by one
    pack_mode: str = "sequential"

    def __post_init__(self) -> None:
        if self.pack_mode not in PACK_MODES:
            raise ConfigError(f"resources.pack_mode = {self.pack_mode!r}: expected one of "
                              f"{list(PACK_MODES)}")
        if not (number(self.cpus_per_region) and self.cpus_per_region > 0):
            raise ConfigError(f"resources.cpus_per_region = {self.cpus_per_region!r}: must be "
                              "a finite number > 0")
        if not (number(self.gpu_fraction) and 0 < self.gpu_fraction <= 1):
            raise ConfigError(f"resources.gpu_fraction = {self.gpu_fraction!r}: must be in "
                              "(0, 1]")
        if not (integer(self.regions_per_worker) and self.regions_per_worker >= 1):
            raise ConfigError(f"resources.regions_per_worker = {self.regions_per_worker!r}: "
                              "must be an integer >= 1")
        if not (integer(self.max_failures) and self.max_failures >= -1):
            raise ConfigError(f"resources.max_failures = {self.max_failures!r}: must be an "
                              "integer >= -1 (-1: retry forever)")


@dataclass
class JobProfile:
    """A whole job's settings (see the module docstring)."""

    job: JobSection
    train: TrainConfig
    finetune: dict[str, Any]
    evaluate: EvaluateSettings
    resources: ResourcesSection
    profile: str = "custom"  # the profile's name or file it came from

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "profile") -> JobProfile:
        sections = {"job", "train", "finetune", "evaluate", "resources"}
        unknown = sorted(set(data) - sections)
        if unknown:
            raise ConfigError(f"{source}: unknown table(s) {unknown}; expected {sorted(sections)}")
        train = TrainConfig.from_dict(dict(data.get("train", {})), source=f"{source} [train]")
        finetune = dict(data.get("finetune", {}))
        # validate the fine-tune overrides now, not after hours of global training
        TrainConfig.from_dict({**train.to_dict(), **finetune}, source=f"{source} [finetune]")
        return cls(
            job=from_table(JobSection, dict(data.get("job", {})), f"{source} [job]"),
            train=train,
            finetune=finetune,
            evaluate=from_table(EvaluateSettings, dict(data.get("evaluate", {})),
                                 f"{source} [evaluate]"),
            resources=from_table(ResourcesSection, dict(data.get("resources", {})),
                                  f"{source} [resources]"),
            profile=source,
        )

    def finetune_config(self, regions: list[str]) -> TrainConfig:
        """The fine-tuning TrainConfig (fixed ``finetune_lr`` unless the profile says
        otherwise)."""
        merged = {**self.train.to_dict(), "finetune": True, **self.finetune, "regions": regions}
        return TrainConfig.from_dict(merged, source=f"{self.profile} [finetune]")

    def to_dict(self) -> dict[str, Any]:
        return {"job": asdict(self.job), "train": self.train.to_dict(),
                "finetune": dict(self.finetune), "evaluate": asdict(self.evaluate),
                "resources": asdict(self.resources), "profile": self.profile}

    def config_hash(self) -> str:
        """Hash of everything that changes a trained/evaluated model (not names, resources)."""
        d = self.to_dict()
        d["train"] = self.train.hash_dict(("device", "threads", "regions"))
        relevant = {k: d[k] for k in ("train", "finetune", "evaluate")}
        relevant["mode"] = d["job"]["mode"]
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def load_profile(name_or_path: str | Path) -> JobProfile:
    """``smoke``/``paper`` (shipped) or a TOML/YAML/JSON file path."""
    path = Path(name_or_path)
    if not path.suffix and (PROFILE_DIR / f"{name_or_path}.toml").exists():
        path = PROFILE_DIR / f"{name_or_path}.toml"
        source = str(name_or_path)
    elif path.is_file():
        source = str(path)
    else:
        shipped = sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))
        raise ConfigError(f"profile {str(name_or_path)!r} is neither a shipped profile "
                          f"{shipped} nor an existing file")
    return JobProfile.from_dict(load_mapping(path), source=source)
