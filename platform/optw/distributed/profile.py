"""Job profiles: what the platform job trains, fine-tunes and evaluates, loaded from TOML/YAML.

A profile has four tables: ``[job]`` (name, mode, groups, regions), ``[train]`` (a
:class:`~optw.train.TrainConfig` for scratch and global models), ``[finetune]`` (overrides of
``[train]`` for fine-tuning stages), ``[evaluate]`` and ``[resources]``. ``smoke`` and ``paper``
ship with the package (``optw/distributed/profiles/``); copy one to make your own.

``[job] groups`` are benchmark groups, ``custom`` (regions added with ``optw catalog add``) or
any custom group of the catalog; the job checks them against ITS catalog before training
(:func:`optw.distributed.plan.select_regions`). ``[job] from_groups`` are the source groups of
mode ``transfer-to`` (default: every benchmark group).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optw.catalog import CUSTOM_GROUP, GROUPS
from optw.checks import from_table, integer, load_mapping, number
from optw.errors import ConfigError
from optw.evaluate.protocol import EvaluateSettings
from optw.train.config import TrainConfig

if TYPE_CHECKING:
    from optw.distributed.plan import Unit

PROFILE_DIR = Path(__file__).with_name("profiles")
MODES = ("scratch", "global-ft", "transfer", "transfer-to")
PACK_MODES = ("sequential", "batched")


@dataclass
class JobSection:
    name: str = "optw"
    mode: str = "scratch"
    groups: list[str] = field(default_factory=lambda: list(GROUPS))
    regions: list[str] = field(default_factory=list)
    #: mode transfer-to: the benchmark groups whose global model is fine-tuned onto the
    #: job's regions (empty: every benchmark group)
    from_groups: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("groups", "regions", "from_groups"):
            value = getattr(self, name)
            if not (isinstance(value, list) and all(isinstance(v, str) and v for v in value)):
                raise ConfigError(f"job.{name} = {value!r}: must be a list of names")
        if self.mode not in MODES:
            raise ConfigError(f"job.mode = {self.mode!r}: expected one of {list(MODES)}")
        bad = sorted(set(self.groups) - set(known_groups(self.groups)))
        if bad or not self.groups:
            raise ConfigError(f"job.groups = {self.groups!r}: unknown group(s) {bad}; "
                              f"expected some of {list(GROUPS)}, {CUSTOM_GROUP!r} or a custom "
                              "group of the catalog")
        bad = sorted(set(self.from_groups) - set(GROUPS))
        if bad:
            raise ConfigError(f"job.from_groups = {self.from_groups!r}: not benchmark "
                              f"group(s) {bad}; expected some of {list(GROUPS)}")
        if self.from_groups and self.mode != "transfer-to":
            raise ConfigError(f"job.from_groups = {self.from_groups!r}: only mode "
                              f"'transfer-to' fine-tunes from other groups (mode is "
                              f"{self.mode!r})")
        if not isinstance(self.name, str) or not self.name or any(c in self.name for c in "/\\ "):
            raise ConfigError(f"job.name = {self.name!r}: must be a non-empty word")


#: The catalog whose custom groups a profile being loaded may name (``optw job run
#: --catalog``); unset: the default catalog.
CATALOG_HINT: contextvars.ContextVar[str | None] = contextvars.ContextVar("catalog_hint",
                                                                          default=None)


def known_groups(groups: list[str] | None = None) -> list[str]:
    """Groups a profile may name: the benchmark groups, ``custom`` and, when ``groups`` has
    other names, the custom groups of the catalog (:data:`CATALOG_HINT`, else
    ``$OPTW_CATALOG`` or ``region_catalog/``) if it can be read. The job checks its groups
    against its own catalog again before it trains
    (:func:`optw.distributed.plan.select_regions`)."""
    known = [*GROUPS, CUSTOM_GROUP]
    if groups is None or set(groups) <= set(known):
        return known
    try:
        from optw import paths
        from optw.catalog import Catalog

        location = CATALOG_HINT.get() or paths.catalog_location()
        if "://" in location:
            return known
        return [*known, *(g for g in Catalog(location).groups if g not in known)]
    except Exception:  # noqa: BLE001 - no readable default catalog: the job checks its own
        return known


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
    #: rounding); the job's plan decides per pack (:func:`optw.distributed.plan.packs`): packs
    #: that cannot batch (global models, mixed model shapes) are planned one by one
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
    #: ``[global.<group>]`` tables: overrides of ``[train]`` for that group's global model
    #: (global-ft mode), e.g. more epochs for a group of larger regions
    global_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "profile") -> JobProfile:
        sections = {"job", "train", "finetune", "evaluate", "resources", "global"}
        unknown = sorted(set(data) - sections)
        if unknown:
            raise ConfigError(f"{source}: unknown table(s) {unknown}; expected {sorted(sections)}")
        train = TrainConfig.from_dict(dict(data.get("train", {})), source=f"{source} [train]")
        finetune = dict(data.get("finetune", {}))
        # validate the fine-tune overrides now, not after hours of global training
        TrainConfig.from_dict({**train.to_dict(), **finetune}, source=f"{source} [finetune]")
        overrides = data.get("global", {})
        if not (isinstance(overrides, dict)
                and all(isinstance(v, dict) for v in overrides.values())):
            raise ConfigError(f"{source} [global]: expected tables [global.<group>] of [train] "
                              "settings")
        for group, table in overrides.items():
            TrainConfig.from_dict({**train.to_dict(), **table},
                                  source=f"{source} [global.{group}]")
        return cls(
            job=from_table(JobSection, dict(data.get("job", {})), f"{source} [job]"),
            train=train,
            finetune=finetune,
            evaluate=from_table(EvaluateSettings, dict(data.get("evaluate", {})),
                                 f"{source} [evaluate]"),
            resources=from_table(ResourcesSection, dict(data.get("resources", {})),
                                  f"{source} [resources]"),
            profile=source,
            global_overrides={g: dict(t) for g, t in overrides.items()},
        )

    def global_config(self, group: str, regions: list[str]) -> TrainConfig:
        """The TrainConfig of ``group``'s global model: ``[train]`` with the group's
        ``[global.<group>]`` overrides."""
        merged = {**self.train.to_dict(), **self.global_overrides.get(group, {}),
                  "regions": regions}
        return TrainConfig.from_dict(merged, source=f"{self.profile} [global.{group}]")

    def finetune_config(self, regions: list[str]) -> TrainConfig:
        """The fine-tuning TrainConfig (fixed ``finetune_lr`` unless the profile says
        otherwise)."""
        merged = {**self.train.to_dict(), "finetune": True, **self.finetune, "regions": regions}
        return TrainConfig.from_dict(merged, source=f"{self.profile} [finetune]")

    def config_for(self, unit: Unit) -> TrainConfig:
        """The TrainConfig of one planned model, resolved once when the job plans its packs:
        ``[finetune]`` for a fine-tuned unit, ``[global.<group>]`` for a group's global model,
        else ``[train]``; always with the unit's training regions."""
        if unit.finetune:
            return self.finetune_config(unit.train_regions)
        if unit.group is not None:
            return self.global_config(unit.group, unit.train_regions)
        return self.train.replace(regions=list(unit.train_regions))

    def to_dict(self) -> dict[str, Any]:
        return {"job": asdict(self.job), "train": self.train.to_dict(),
                "finetune": dict(self.finetune), "evaluate": asdict(self.evaluate),
                "resources": asdict(self.resources), "profile": self.profile,
                "global": {g: dict(t) for g, t in self.global_overrides.items()}}

    def config_hash(self) -> str:
        """Hash of everything that changes a trained/evaluated model (not names, resources)."""
        d = self.to_dict()
        d["train"] = self.train.hash_dict(("device", "threads", "regions"))
        relevant = {k: d[k] for k in ("train", "finetune", "evaluate")}
        relevant["mode"] = d["job"]["mode"]
        if self.global_overrides:  # profiles without them keep their hashes (registries)
            relevant["global"] = d["global"]
        if self.job.mode == "transfer-to":  # other modes keep their hashes (their registries)
            relevant["from_groups"] = sorted(self.job.from_groups or GROUPS)
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
