"""Which models a job trains, in which order, and what each one is evaluated and registered as.

Modes follow the paper's experiments:

- ``scratch``: one model per region, trained from scratch (method ``model``);
- ``global-ft``: one global model per group trained on all its selected regions, then
  fine-tuned on each region (method ``global_ft``);
- ``transfer``: per group, a global model trained WITHOUT the paper's subset of 28, evaluated as
  it is on the subset regions left out (method ``tl``) and fine-tuned on each of them
  (method ``ft_tl``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from optw.catalog import PAPER_SUBSET, Catalog


@dataclass
class Unit:
    """One Ray Train run (one actor): a model trained on ``train_regions``."""

    stage: str  # scratch | global | finetune
    key: str  # region id, or global-<group> / transfer-<group>
    train_regions: list[str]
    eval_regions: list[str] = field(default_factory=list)
    method: str = "model"  # the name evaluation results carry
    register: bool = False  # a new registry version for key (a region) after evaluation
    init_from: str | None = None  # key of the unit whose final checkpoint starts this one

    @property
    def finetune(self) -> bool:
        return self.init_from is not None


def select_regions(catalog: Catalog, groups: list[str], regions: list[str]) -> list[str]:
    """The job's regions: the listed ones (checked) or all regions of the groups."""
    if regions:
        for rid in regions:
            catalog.region(rid)  # KeyError names an unknown region
        return list(dict.fromkeys(regions))
    return catalog.list_regions(groups)


def plan(mode: str, catalog: Catalog, selected: list[str]) -> list[list[Unit]]:
    """Stages (lists of units that may run concurrently), in order."""
    group_of = catalog.regions_table["group"].to_dict()
    if mode == "scratch":
        return [[Unit("scratch", r, [r], [r], "model", register=True) for r in selected]]
    by_group: dict[str, list[str]] = {}
    for r in selected:
        by_group.setdefault(group_of[r], []).append(r)
    if mode == "global-ft":
        first = [Unit("global", f"global-{g}", rs) for g, rs in by_group.items()]
        second = [Unit("finetune", r, [r], [r], "global_ft", register=True,
                       init_from=f"global-{group_of[r]}") for r in selected]
        return [first, second]
    if mode == "transfer":
        first, second = [], []
        for g, rs in by_group.items():
            left_out = [r for r in rs if r in PAPER_SUBSET]
            if not left_out:
                continue
            train_on = [r for r in catalog.list_regions(g) if r not in PAPER_SUBSET]
            first.append(Unit("global", f"transfer-{g}", train_on, left_out, "tl"))
            second += [Unit("finetune", r, [r], [r], "ft_tl", register=True,
                            init_from=f"transfer-{g}") for r in left_out]
        if not first:
            raise ValueError("transfer mode evaluates the paper's subset of 28, but none of the "
                             f"selected regions is in it: {selected[:5]}...")
        return [first, second]
    raise ValueError(f"unknown mode {mode!r}; expected scratch, global-ft or transfer")
