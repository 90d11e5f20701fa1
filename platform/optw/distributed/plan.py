"""Which models a job trains in each mode (README.md's table; each unit names the evaluation
method its results carry), in which order, and how they are packed into Ray Train workers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from optw.catalog import CUSTOM_GROUP, GROUPS, PAPER_SUBSET, Catalog
from optw.errors import UserError
from optw.train.config import TrainConfig
from optw.train.rollouts import PACK_ROLLOUTS


@dataclass(frozen=True)
class Unit:
    """One Ray Train run (one actor): a model trained on ``train_regions``."""

    stage: str  # scratch | global | finetune
    key: str  # region id, or global-<group> / transfer-<group>
    train_regions: list[str]
    eval_regions: list[str] = field(default_factory=list)
    method: str = "model"  # the name evaluation results carry
    register: bool = False  # a new registry version for key (a region) after evaluation
    init_from: str | None = None  # key of the unit whose final checkpoint starts this one
    group: str | None = None  # mode global-ft: the global model's ([global.<group>])


class UnknownGroupError(UserError):
    """A job's group that its catalog does not have (or that has no regions)."""


def select_regions(catalog: Catalog, groups: list[str], regions: list[str]) -> list[str]:
    """The job's regions: the listed ones or all regions of the groups, checked."""
    if regions:
        for rid in regions:
            catalog.region(rid)  # KeyError names an unknown region
        return list(dict.fromkeys(regions))
    with_regions = set(catalog.regions_table["group"].astype(str))
    present = [g for g in catalog.groups if g in with_regions]  # the catalog's order
    if unknown := sorted(set(groups) - set(present)):
        custom = [g for g in present if g not in GROUPS]
        hint = (f"; add a region with `optw catalog add REGION --points FILE"
                f"{'' if unknown == [CUSTOM_GROUP] else ' --group ' + unknown[0]}`")
        raise UnknownGroupError(
            f"job groups {unknown} have no regions in the catalog at {catalog.path} (its "
            f"groups: {present}{'' if custom else ', no custom ones'}){hint}")
    return catalog.list_regions(groups)


def source_regions(catalog: Catalog, from_groups: list[str], targets: list[str]) -> list[str]:
    """Mode ``transfer-to``: the source groups' regions that are not targets."""
    groups = list(from_groups) or list(GROUPS)
    present = set(catalog.regions_table["group"].astype(str))
    if missing := [g for g in groups if g not in present]:
        raise UnknownGroupError(f"from_groups {missing} have no regions in the catalog at "
                                f"{catalog.path} (its groups: {sorted(present)})")
    out = [r for r in catalog.list_regions(groups) if r not in set(targets)]
    if not out:
        raise UserError(f"transfer-to: the source groups {groups} have no regions left "
                        f"besides the targets {targets}")
    return out


def source_key(from_groups: list[str]) -> str:
    """Mode ``transfer-to``'s global model key: ``source-solomon-cordeau``, ``source-all``."""
    groups = [g for g in GROUPS if g in (from_groups or GROUPS)]
    return "source-all" if groups == list(GROUPS) else "source-" + "-".join(groups)


#: A fine-tune's ``init_from`` that names a released global model, not a planned unit.
RELEASE_PREFIX = "release:"


def release_key(group: str) -> str:
    """``init_from`` of a model that starts from ``group``'s release (``release:gavalas``)."""
    return f"{RELEASE_PREFIX}{group}"


def plan(mode: str, catalog: Catalog, selected: list[str],
         from_groups: list[str] | None = None,
         releases: Sequence[str] = ()) -> list[list[Unit]]:
    """Stages (lists of units that may run concurrently), in order. ``releases``: groups whose
    released global model replaces the global model the job would train (global-ft; and
    transfer-to from one such group)."""
    group_of = catalog.regions_table["group"].to_dict()
    if mode == "scratch":
        return [[Unit("scratch", r, [r], [r], "model", register=True) for r in selected]]
    by_group: dict[str, list[str]] = {}
    for r in selected:
        by_group.setdefault(group_of[r], []).append(r)
    if mode == "global-ft":
        start = {g: release_key(g) if g in releases else f"global-{g}" for g in by_group}
        return [[Unit("global", f"global-{g}", rs, group=g) for g, rs in by_group.items()
                 if g not in releases],
                [Unit("finetune", r, [r], [r], "global_ft", register=True,
                      init_from=start[group_of[r]]) for r in selected]]
    if mode == "transfer":
        first, second = [], []
        for g, rs in by_group.items():
            if left_out := [r for r in rs if r in PAPER_SUBSET]:
                train_on = [r for r in catalog.list_regions(g) if r not in PAPER_SUBSET]
                first.append(Unit("global", f"transfer-{g}", train_on, left_out, "tl"))
                second += [Unit("finetune", r, [r], [r], "ft_tl", register=True,
                                init_from=f"transfer-{g}") for r in left_out]
        if not first:
            raise UserError("transfer mode evaluates the paper's subset of 28, but none of the "
                            f"selected regions is in it: {selected[:5]}...")
        return [first, second]
    if mode == "transfer-to":
        key = source_key(from_groups or [])
        if len(from_groups or []) == 1 and from_groups[0] in releases:  # type: ignore[index]
            return [[], [Unit("finetune", r, [r], [r], "ft_tl", register=True,
                              init_from=release_key(from_groups[0]))  # type: ignore[index]
                         for r in selected]]
        return [[Unit("global", key, source_regions(catalog, from_groups or [], selected),
                      list(selected), "tl")],
                [Unit("finetune", r, [r], [r], "ft_tl", register=True, init_from=key)
                 for r in selected]]
    raise ValueError(f"unknown mode {mode!r}; expected scratch, global-ft, transfer or "
                     "transfer-to")


@dataclass(frozen=True)
class Member:
    """One model of a pack: its unit and its TrainConfig (``JobProfile.config_for``)."""

    unit: Unit
    config: TrainConfig


@dataclass(frozen=True)
class PackSpec:
    """The models one Ray Train worker trains: side by side (``batched``) or in turn."""

    members: tuple[Member, ...]
    batched: bool = False

    @property
    def units(self) -> list[Unit]:
        return [m.unit for m in self.members]

    @property
    def keys(self) -> list[str]:
        return [m.unit.key for m in self.members]

    def __len__(self) -> int:
        return len(self.members)


def batchable(configs: Sequence[TrainConfig]) -> bool:
    """Can these per-region models train side by side in one batched step?"""
    from optw.model import ModelConfig

    def shape(c: TrainConfig) -> tuple:
        return (json.dumps(ModelConfig.from_dict(c.model).to_dict(), sort_keys=True),
                c.device, c.threads)

    return (len(configs) > 1 and all(len(c.regions) == 1 for c in configs)
            and all(c.rollout in PACK_ROLLOUTS and not c.demos for c in configs)
            and len({shape(c) for c in configs}) == 1)


def packs(members: Sequence[Member], size: int, capacity: int = 1,
          pack_mode: str = "sequential") -> list[PackSpec]:
    """A stage's models in packs of at most ``size``, smaller to keep ``capacity`` slots busy."""
    size = max(1, min(size, -(-len(members) // max(capacity, 1))))
    chunks = [tuple(members[i:i + size]) for i in range(0, len(members), size)]
    return [PackSpec(c, pack_mode == "batched" and batchable([m.config for m in c]))
            for c in chunks]
