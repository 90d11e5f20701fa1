"""Job profiles: what the platform job trains, fine-tunes and evaluates, loaded from TOML/YAML.

A profile has six tables: ``[job]`` (name, mode, groups, regions), ``[train]`` (a
:class:`~optw.train.TrainConfig` for scratch and global models), ``[global.<group>]`` (changes
of ``[train]`` for that group's global model, mode ``global-ft``), ``[finetune]`` (changes of
``[train]`` for fine-tuned models), ``[evaluate]`` and ``[resources]``. ``quick``, ``smoke`` and
``paper`` ship with the package (``optw/distributed/profiles/``); copy one to make your own.

A profile is read once into typed, checked objects (:func:`load_profile`): one
:class:`~optw.train.TrainConfig` for ``[train]``, one for ``[finetune]`` and one per
``[global.<group>]``, all built when it loads. An unknown table or key, or a value out of
range, is a :class:`~optw.errors.ConfigError` naming the file, the table and the key. The
command line's job options change the loaded object (:meth:`JobProfile.with_job`), and each
planned model's TrainConfig is one of those objects with the model's training regions
(:meth:`JobProfile.config_for`).

``[job] groups`` and the groups of ``[global.<group>]`` tables are benchmark groups, ``custom``
(regions added with ``optw catalog add``) or custom groups of the job's catalog, which
:func:`load_profile` is given (without one: benchmark groups and ``custom``); the job checks
that its groups have regions there before it trains
(:func:`optw.distributed.plan.select_regions`). ``[job] from_groups`` are the source groups of
mode ``transfer-to`` (default: every benchmark group).
"""

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
from optw.errors import ConfigError
from optw.evaluate.protocol import EvaluateSettings
from optw.train.config import TrainConfig

if TYPE_CHECKING:
    from optw.catalog import Catalog
    from optw.distributed.plan import Unit

PROFILE_DIR = Path(__file__).with_name("profiles")
MODES = ("scratch", "global-ft", "transfer", "transfer-to")
PACK_MODES = ("sequential", "batched")
#: A profile's tables.
TABLES = ("job", "train", "global", "finetune", "evaluate", "resources")
#: Longest job name (it names an MLflow experiment and folders).
MAX_NAME = 100
#: Most CPUs one region worker may ask for.
MAX_CPUS = 1024
#: Most restarts of a region worker that died.
MAX_FAILURES = 100
#: Most regions one worker trains.
MAX_REGIONS_PER_WORKER = 10_000


def _names(value: Any, key: str) -> None:
    """``value`` must be a list of distinct non-empty names (:class:`ConfigError` naming
    ``key``)."""
    require(isinstance(value, list) and all(isinstance(v, str) and v for v in value), key,
            value, "must be a list of names")
    twice = [v for i, v in enumerate(value) if v in value[:i]]
    require(not twice, key, value, f"names {twice[0]!r} twice" if twice else "")


@dataclass(frozen=True)
class JobSection:
    """``[job]``: what the job trains."""

    name: str = "optw"
    mode: str = "scratch"
    groups: list[str] = field(default_factory=lambda: list(GROUPS))
    #: the regions to train (empty: every region of ``groups``)
    regions: list[str] = field(default_factory=list)
    #: mode transfer-to: the benchmark groups whose global model is fine-tuned onto the
    #: job's regions (empty: every benchmark group)
    from_groups: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for key in ("groups", "regions", "from_groups"):
            _names(getattr(self, key), f"job.{key}")
        require(self.mode in MODES, "job.mode", self.mode, f"expected one of {list(MODES)}")
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
    """Groups a profile may name: the benchmark groups, ``custom`` and the custom groups of
    ``catalog`` (the job's)."""
    known = [*GROUPS, CUSTOM_GROUP]
    if catalog is not None:
        known += [g for g in catalog.groups if g not in known]
    return known


@dataclass(frozen=True)
class ResourcesSection:
    """``[resources]``: what each region worker asks Ray for, and how models are packed."""

    cpus_per_region: float = 1.0  # per Ray Train worker (one pack of regions)
    gpu_fraction: float = 0.25
    #: restarts of a worker that died (a killed process, a lost node), from its last
    #: checkpoint; a worker that fails on a setting (an error naming it) is never restarted
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
    """A whole job's settings (see the module docstring), checked when built. The
    fine-tuned models' and the global models' TrainConfigs are built from ``train`` and the
    tables as written, once per profile object (a changed copy, ``dataclasses.replace``,
    builds its own)."""

    job: JobSection
    train: TrainConfig
    evaluate: EvaluateSettings
    resources: ResourcesSection
    profile: str = "custom"  # the profile's name or file it came from
    #: ``[finetune]`` as written: changes of ``[train]`` for the fine-tuned models
    finetune_table: Mapping[str, Any] = field(default_factory=dict)
    #: ``[global.<group>]`` as written: changes of ``[train]`` for that group's global model
    #: (mode global-ft), e.g. fewer epochs for a group of small regions
    global_tables: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: the fine-tuned models' TrainConfig: ``[train]``, ``finetune = true``, ``[finetune]``
    finetune: TrainConfig = field(init=False)
    #: each ``[global.<group>]`` group's global model's TrainConfig: ``[train]`` and the table
    global_train: Mapping[str, TrainConfig] = field(init=False)

    def __post_init__(self) -> None:
        base = self.train.to_dict()
        finetune = TrainConfig.from_dict({**base, "finetune": True, **self.finetune_table},
                                         source=f"{self.profile} [finetune]")
        object.__setattr__(self, "finetune", finetune)
        object.__setattr__(self, "global_train", {
            g: TrainConfig.from_dict({**base, **t}, source=f"{self.profile} [global.{g}]")
            for g, t in self.global_tables.items()})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "profile",
                  catalog: Catalog | None = None) -> JobProfile:
        """A profile from its tables, checked (errors name ``source``, its file, the table
        and the key); ``catalog``: the job's, whose custom groups it may name."""
        unknown = sorted(map(str, set(data) - set(TABLES)))
        if unknown:
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
                                  "tables [global.<group>] of [train] settings",
                                  f"global.{group}")
            if group not in known:
                raise ConfigError(
                    f"{source} [global.{group}]: unknown group {group!r}; [global.<group>] "
                    f"tables change [train] for a group's global model: one of {known}"
                    f"{'' if catalog else ' or a custom group of the catalog'}",
                    f"global.{group}")
        for name, table in (("train", tables["train"]), ("finetune", tables["finetune"]),
                            *((f"global.{g}", t) for g, t in tables["global"].items())):
            if "regions" in table:
                raise ConfigError(f"{source} [{name}]: regions = {shown(table['regions'])}: "
                                  "a job's regions are [job] regions (or groups)",
                                  f"{name}.regions")
        profile = cls(
            job=from_table(JobSection, tables["job"], f"{source} [job]"),
            train=TrainConfig.from_dict(tables["train"], source=f"{source} [train]"),
            evaluate=from_table(EvaluateSettings, tables["evaluate"], f"{source} [evaluate]"),
            resources=from_table(ResourcesSection, tables["resources"],
                                 f"{source} [resources]"),
            profile=source, finetune_table=tables["finetune"],
            global_tables={g: dict(t) for g, t in tables["global"].items()})
        try:
            profile.check_groups(catalog)
        except ConfigError as exc:
            raise ConfigError(f"{source} [job]: {exc}", exc.key) from None
        return profile

    def check_groups(self, catalog: Catalog | None = None) -> None:
        """``[job] groups`` must be groups a profile may name (:func:`known_groups` of
        ``catalog``); a :class:`ConfigError` naming ``job.groups`` otherwise."""
        known = known_groups(catalog)
        bad = [g for g in self.job.groups if g not in known]
        custom = (f"the custom groups of the catalog at {catalog.path}: "
                  f"{known[len(GROUPS) + 1:]}" if catalog else "a custom group of the catalog")
        require(not bad, "job.groups", self.job.groups, f"unknown group(s) {bad}; expected "
                f"some of {list(GROUPS)}, {CUSTOM_GROUP!r} or {custom}")

    def with_job(self, changes: Mapping[str, Any], catalog: Catalog | None = None,
                 names: Mapping[str, str] | None = None) -> JobProfile:
        """This profile with ``changes`` of its ``[job]`` settings (the command line's
        options), checked as the file's are (groups against ``catalog``); an error about a
        changed key starts with ``names[key]`` (the option that gave it)."""
        try:
            out = dataclasses.replace(self, job=dataclasses.replace(self.job, **changes))
            out.check_groups(catalog)
        except ConfigError as exc:
            key = (exc.key or "").removeprefix("job.")
            label = (names or {}).get(key) if key in changes else None
            raise ConfigError(f"{label or f'{self.profile} [job]'}: {exc}", exc.key) from None
        return out

    def config_for(self, unit: Unit) -> TrainConfig:
        """The TrainConfig of one planned model: the fine-tuned models' (``[finetune]``),
        its group's global model's (``[global.<group>]``) or ``[train]``, with the unit's
        training regions."""
        return self._base(unit)[1].replace(regions=list(unit.train_regions))

    def table_of(self, unit: Unit) -> str:
        """Where :meth:`config_for` ``(unit)`` comes from, as errors name it: the profile and
        its table (``quick [global.solomon]``)."""
        return f"{self.profile} {self._base(unit)[0]}"

    def _base(self, unit: Unit) -> tuple[str, TrainConfig]:
        if unit.finetune:
            return "[finetune]", self.finetune
        if unit.group in self.global_train:
            return f"[global.{unit.group}]", self.global_train[unit.group]
        return "[train]", self.train

    def to_dict(self) -> dict[str, Any]:
        """The profile's tables as loaded (``[finetune]`` and ``[global.<group>]`` as
        written)."""
        return {"job": asdict(self.job), "train": self.train.to_dict(),
                "finetune": dict(self.finetune_table), "evaluate": asdict(self.evaluate),
                "resources": asdict(self.resources), "profile": self.profile,
                "global": {g: dict(t) for g, t in self.global_tables.items()}}

    def config_hash(self) -> str:
        """Hash of everything that changes a trained/evaluated model (not names, resources)."""
        d = self.to_dict()
        d["train"] = self.train.hash_dict(("device", "threads", "regions"))
        relevant = {k: d[k] for k in ("train", "finetune", "evaluate")}
        relevant["mode"] = d["job"]["mode"]
        if self.global_tables:  # profiles without them keep their hashes (registries)
            relevant["global"] = d["global"]
        if self.job.mode == "transfer-to":  # other modes keep their hashes (their registries)
            relevant["from_groups"] = sorted(self.job.from_groups or GROUPS)
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def load_profile(name_or_path: str | Path, catalog: Catalog | None = None) -> JobProfile:
    """``quick``/``smoke``/``paper`` (shipped) or a TOML/YAML/JSON file path, checked
    (:meth:`JobProfile.from_dict`); ``catalog``: the job's, whose custom groups the profile
    may name."""
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
    return JobProfile.from_dict(load_mapping(path), source=source, catalog=catalog)
