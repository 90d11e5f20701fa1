"""Job profiles (TOML/YAML: ``[job]``, ``[train]``, ``[global.<group>]``, ``[finetune]``,
``[finetune.release]``, ``[evaluate]``, ``[resources]``); ``quick``, ``smoke`` and ``paper``
ship in ``profiles/``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optw.catalog import CUSTOM_GROUP, GROUPS
from optw.checks import from_table, integer, load_mapping, number, require, shown
from optw.distributed.plan import RELEASE_PREFIX
from optw.errors import ConfigError
from optw.evaluate.protocol import EvaluateSettings
from optw.train.config import TrainConfig

if TYPE_CHECKING:
    from optw.catalog import Catalog
    from optw.distributed.plan import Unit

PROFILE_DIR = Path(__file__).with_name("profiles")
MODES = ("scratch", "global-ft", "transfer", "transfer-to")
PACK_MODES = ("sequential", "batched")
TABLES = ("job", "train", "global", "finetune", "evaluate", "resources")
#: ``[finetune.release]``: changes of ``[finetune]`` for the regions fine-tuned from their own
#: group's release (a long-trained start wants a smaller step than a job's global model).
RELEASE_TABLE = "release"
#: Bounds: a job name's length, one region worker's CPUs, its restarts, the regions it trains.
MAX_NAME, MAX_CPUS, MAX_FAILURES, MAX_REGIONS_PER_WORKER = 100, 1024, 100, 10_000


@dataclass(frozen=True)
class JobSection:
    """``[job]``: what the job trains."""

    name: str = "optw"
    mode: str = "scratch"
    groups: list[str] = field(default_factory=lambda: list(GROUPS))
    regions: list[str] = field(default_factory=list)  # empty: every region of groups
    from_groups: list[str] = field(default_factory=list)  # transfer-to's sources (empty: all)
    #: global-ft (and transfer-to from one group): start from the group's released global
    #: model where one ships (docs/releases.md), instead of training one in the job
    releases: bool = False

    def __post_init__(self) -> None:
        for key in ("groups", "regions", "from_groups"):  # lists of distinct non-empty names
            value = getattr(self, key)
            require(isinstance(value, list) and all(isinstance(v, str) and v for v in value),
                    f"job.{key}", value, "must be a list of names")
            twice = [v for i, v in enumerate(value) if v in value[:i]]
            require(not twice, f"job.{key}", value, f"names {twice[0]!r} twice" if twice else "")
        require(self.mode in MODES, "job.mode", self.mode, f"expected one of {list(MODES)}")
        require(type(self.releases) is bool, "job.releases", self.releases,
                "must be true or false")
        require(bool(self.groups), "job.groups", self.groups, "give at least one group")
        bad = sorted(set(self.from_groups) - set(GROUPS))
        require(not bad, "job.from_groups", self.from_groups,
                f"not benchmark group(s) {bad}; expected some of {list(GROUPS)}")
        require(not self.from_groups or self.mode == "transfer-to", "job.from_groups",
                self.from_groups, f"only mode 'transfer-to' fine-tunes from other groups "
                f"(mode is {self.mode!r})")
        require(isinstance(self.name, str) and 0 < len(self.name) <= MAX_NAME
                and self.name.isprintable() and not any(c in self.name for c in "/\\ "),
                "job.name", self.name,
                f"must be a word of 1..{MAX_NAME} characters (no spaces or slashes)")


def known_groups(catalog: Catalog | None = None) -> list[str]:
    """Groups a profile may name: the benchmark groups, ``custom`` and ``catalog``'s."""
    known = [*GROUPS, CUSTOM_GROUP]
    if catalog is not None:
        known += [g for g in catalog.groups if g not in known]
    return known


@dataclass(frozen=True)
class ResourcesSection:
    """``[resources]``: what each region worker asks Ray for, and how models are packed."""

    cpus_per_region: float = 1.0  # per Ray Train worker (one pack of regions)
    gpu_fraction: float = 0.25
    max_failures: int = 2  # restarts of a worker that died, from its last checkpoint
    regions_per_worker: int = 1  # models one worker trains (a pack): more for short budgets
    pack_mode: str = "sequential"  # or "batched" (side by side where the models allow)

    def __post_init__(self) -> None:
        require(self.pack_mode in PACK_MODES, "resources.pack_mode", self.pack_mode,
                f"expected one of {list(PACK_MODES)}")
        require(number(self.cpus_per_region) and 0 < self.cpus_per_region <= MAX_CPUS,
                "resources.cpus_per_region", self.cpus_per_region,
                f"must be a number in (0, {MAX_CPUS}]")
        require(number(self.gpu_fraction) and 0 < self.gpu_fraction <= 1,
                "resources.gpu_fraction", self.gpu_fraction, "must be in (0, 1]")
        require(integer(self.regions_per_worker)
                and 1 <= self.regions_per_worker <= MAX_REGIONS_PER_WORKER,
                "resources.regions_per_worker", self.regions_per_worker,
                f"must be an integer in 1..{MAX_REGIONS_PER_WORKER:,}")
        require(integer(self.max_failures) and 0 <= self.max_failures <= MAX_FAILURES,
                "resources.max_failures", self.max_failures,
                f"must be an integer in 0..{MAX_FAILURES}: restarts of a worker that died (a "
                "failure of the settings is never retried)")


@dataclass(frozen=True)
class JobProfile:
    """A whole job's settings, checked when built."""

    job: JobSection
    train: TrainConfig
    evaluate: EvaluateSettings
    resources: ResourcesSection
    profile: str = "custom"  # the profile's name or file it came from
    finetune_table: Mapping[str, Any] = field(default_factory=dict)  # [finetune] as written
    global_tables: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # by group
    finetune: TrainConfig = field(init=False)  # [train], finetune = true and [finetune]
    #: [finetune] changed by [finetune.release] (``finetune`` itself without that table)
    release_finetune: TrainConfig = field(init=False)
    global_train: Mapping[str, TrainConfig] = field(init=False)  # by group

    def __post_init__(self) -> None:
        base = self.train.to_dict()
        table = {k: v for k, v in self.finetune_table.items() if k != RELEASE_TABLE}
        release = self.finetune_table.get(RELEASE_TABLE, {})
        if not isinstance(release, Mapping):
            raise ConfigError(f"{self.profile} [finetune]: {RELEASE_TABLE} = {shown(release)}: "
                              "expected a table [finetune.release] of [finetune] settings for "
                              "the regions fine-tuned from their group's release",
                              f"finetune.{RELEASE_TABLE}")
        object.__setattr__(self, "finetune", TrainConfig.from_dict(
            {**base, "finetune": True, **table}, source=f"{self.profile} [finetune]"))
        object.__setattr__(self, "release_finetune", TrainConfig.from_dict(
            {**base, "finetune": True, **table, **release},
            source=f"{self.profile} [finetune.release]")
            if RELEASE_TABLE in self.finetune_table else self.finetune)
        object.__setattr__(self, "global_train", {
            g: TrainConfig.from_dict({**base, **t}, source=f"{self.profile} [global.{g}]")
            for g, t in self.global_tables.items()})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "profile",
                  catalog: Catalog | None = None) -> JobProfile:
        """A profile from its tables (errors name ``source``, the table and key)."""
        if unknown := sorted(map(str, set(data) - set(TABLES))):
            raise ConfigError(f"{source}: unknown table(s) {unknown}; expected some of "
                              f"{list(TABLES)}")
        tables: dict[str, dict[str, Any]] = {}
        for name in TABLES:
            table = data.get(name, {})
            if not isinstance(table, Mapping):
                raise ConfigError(f"{source}: {name} = {shown(table)}: expected a table "
                                  f"[{name}]", name)
            tables[name] = dict(table)
        known = known_groups(catalog)
        for group, table in tables["global"].items():
            if not isinstance(table, Mapping):
                raise ConfigError(f"{source} [global]: {group} = {shown(table)}: expected "
                                  "tables [global.<group>] of [train] settings", f"global.{group}")
            if group not in known:
                raise ConfigError(
                    f"{source} [global.{group}]: unknown group {group!r}; [global.<group>] "
                    f"tables change [train] for a group's global model: one of {known}"
                    f"{'' if catalog else ' or a custom group of the catalog'}",
                    f"global.{group}")
        release = tables["finetune"].get(RELEASE_TABLE)
        for name, table in (("train", tables["train"]), ("finetune", tables["finetune"]),
                            *((("finetune.release", release),)
                              if isinstance(release, Mapping) else ()),
                            *((f"global.{g}", t) for g, t in tables["global"].items())):
            if "regions" in table:
                raise ConfigError(f"{source} [{name}]: regions = {shown(table['regions'])}: "
                                  "a job's regions are [job] regions (or groups)",
                                  f"{name}.regions")
        profile = cls(
            job=from_table(JobSection, tables["job"], f"{source} [job]"),
            train=TrainConfig.from_dict(tables["train"], source=f"{source} [train]"),
            evaluate=from_table(EvaluateSettings, tables["evaluate"], f"{source} [evaluate]"),
            resources=from_table(ResourcesSection, tables["resources"], f"{source} [resources]"),
            profile=source, finetune_table=tables["finetune"],
            global_tables={g: dict(t) for g, t in tables["global"].items()})
        try:
            profile.check_groups(catalog)
        except ConfigError as exc:
            raise ConfigError(f"{source} [job]: {exc}", exc.key) from None
        return profile

    def check_groups(self, catalog: Catalog | None = None) -> None:
        """``[job] groups`` must be :func:`known_groups` (else a ConfigError on job.groups)."""
        known = known_groups(catalog)
        bad = [g for g in self.job.groups if g not in known]
        custom = (f"the custom groups of the catalog at {catalog.path}: "
                  f"{known[len(GROUPS) + 1:]}" if catalog else "a custom group of the catalog")
        require(not bad, "job.groups", self.job.groups, f"unknown group(s) {bad}; expected "
                f"some of {list(GROUPS)}, {CUSTOM_GROUP!r} or {custom}")

    def with_job(self, changes: Mapping[str, Any], catalog: Catalog | None = None,
                 names: Mapping[str, str] | None = None) -> JobProfile:
        """This profile with ``changes`` of ``[job]``; errors name the option ``names[key]``."""
        try:
            out = dataclasses.replace(self, job=dataclasses.replace(self.job, **changes))
            out.check_groups(catalog)
        except ConfigError as exc:
            key = (exc.key or "").removeprefix("job.")
            label = (names or {}).get(key) if key in changes else None
            raise ConfigError(f"{label or f'{self.profile} [job]'}: {exc}", exc.key) from None
        return out

    def config_for(self, unit: Unit) -> TrainConfig:
        """A planned model's TrainConfig, with the unit's training regions."""
        return self._base(unit)[1].replace(regions=list(unit.train_regions))

    def table_of(self, unit: Unit) -> str:
        """Where :meth:`config_for` ``(unit)`` comes from (``quick [global.solomon]``)."""
        return f"{self.profile} {self._base(unit)[0]}"

    def _base(self, unit: Unit) -> tuple[str, TrainConfig]:
        if (unit.method == "global_ft" and RELEASE_TABLE in self.finetune_table
                and (unit.init_from or "").startswith(RELEASE_PREFIX)):
            return "[finetune.release]", self.release_finetune  # from its group's release
        if unit.init_from is not None:  # a fine-tuned model
            return "[finetune]", self.finetune
        if unit.group in self.global_train:
            return f"[global.{unit.group}]", self.global_train[unit.group]
        return "[train]", self.train

    def configs(self) -> list[tuple[str, TrainConfig]]:
        """Every ``TrainConfig`` of the profile, with the table it comes from."""
        return [("[train]", self.train), ("[finetune]", self.finetune),
                *((("[finetune.release]", self.release_finetune),)
                  if RELEASE_TABLE in self.finetune_table else ()),
                *((f"[global.{g}]", c) for g, c in self.global_train.items())]

    def to_dict(self) -> dict[str, Any]:
        """The profile's tables as loaded (``[finetune]`` and ``[global.*]`` as written)."""
        return {"job": asdict(self.job), "train": self.train.to_dict(),
                "finetune": dict(self.finetune_table), "evaluate": asdict(self.evaluate),
                "resources": asdict(self.resources), "profile": self.profile,
                "global": {g: dict(t) for g, t in self.global_tables.items()}}

    def config_hash(self, releases: Mapping[str, str] | None = None) -> str:
        """Hash of everything that changes a trained/evaluated model (not names, resources);
        ``releases``: the sha256 of each release the job starts from."""
        relevant = {"train": self.train.hash_dict(("device", "threads", "regions")),
                    "finetune": dict(self.finetune_table), "evaluate": asdict(self.evaluate),
                    "mode": self.job.mode}
        if self.global_tables:  # profiles without them keep their hashes (registries)
            relevant["global"] = {g: dict(t) for g, t in self.global_tables.items()}
        if self.job.mode == "transfer-to":  # other modes keep their hashes (their registries)
            relevant["from_groups"] = sorted(self.job.from_groups or GROUPS)
        if releases:  # a new release retrains its group's models
            relevant["releases"] = dict(sorted(releases.items()))
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def load_profile(name_or_path: str | Path, catalog: Catalog | None = None) -> JobProfile:
    """A shipped profile (``quick``...) or a TOML/YAML/JSON file, checked."""
    path = Path(name_or_path)
    shipped = PROFILE_DIR / f"{name_or_path}.toml"
    if not path.suffix and shipped.exists():
        path, source = shipped, str(name_or_path)
    elif path.is_file():
        source = str(path)
    else:
        names = sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))
        raise ConfigError(f"profile {str(name_or_path)!r} is neither a shipped profile "
                          f"{names} nor an existing file")
    return JobProfile.from_dict(load_mapping(path), source=source, catalog=catalog)
