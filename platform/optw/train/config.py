"""Training parameters: one dataclass, loadable from TOML/YAML, logged with every model."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from optw.catalog.generator import SCORE_KINDS, VALIDATION_SIZE
from optw.checks import from_table, integer, number, require
from optw.errors import ConfigError
from optw.model.config import ModelConfig
from optw.threads import MAX_THREADS
from optw.train.rollouts import ROLLOUTS

#: Seeds accepted (numpy's and torch's generators take 0..2**32-1 and 0..2**64-1).
MAX_SEED = 2**32 - 1
#: Most sampled routes per epoch (``batch_size × tourists_per_epoch``), whatever the machine.
MAX_ROUTES = 1 << 20
#: Most epochs (and other counts of steps, e.g. validation intervals): years of training.
MAX_COUNT = 10**9
#: Most demonstrations per region.
MAX_DEMOS = 100_000
#: Largest learning rate: Adam's step moves each weight by about lr, so above 1 a run
#: diverges at once.
MAX_LR = 1.0
#: Largest entropy bonus (the paper's is 0.01).
MAX_BETA = 10.0
#: Longest time cap of a run: a year.
MAX_MINUTES = 60 * 24 * 366
#: Memory one node row of an epoch's routes is taken to need (the activations its decoding
#: steps keep for the backward), for :func:`check_fits`.
ROW_BYTES = 16 << 10


@dataclass
class TrainConfig:
    """REINFORCE training of one region (or of a global model over several regions); the
    defaults are the paper's and the published training args, every setting is in
    docs/recipes.md."""

    regions: list[str] = field(default_factory=list)
    epochs: int = 500_000
    batch_size: int = 32  # B sampled routes per tourist
    tourists_per_epoch: int = 1  # K tourists × B routes per step (per-tourist mean baseline)
    mix_regions: bool = False  # a global model: a region per step (false) or per tourist
    lr: float = 1e-4
    lr_decay: float = 0.96
    lr_decay_every: int = 5_000
    lr_min: float = 1e-5
    #: step (the paper) | cosine | cosine_time | cosine_budget (docs/recipes.md)
    lr_schedule: str = "step"
    warmup_epochs: int = 0  # linear warm-up of the lr over the first epochs (0: none)
    recipe: str = "paper"  # the preset the other values started from (RECIPES), logged
    #: minutes of training (validation and callbacks excluded) before stopping; None: no cap
    max_minutes: float | None = None
    finetune: bool = False  # fixed lr = finetune_lr, no decay
    finetune_lr: float = 1e-5
    beta: float = 0.01  # entropy bonus
    #: each tourist's advantages: mean (R - its mean, the paper) | normalised (also / its std)
    advantage: str = "mean"
    max_grad_norm: float = 1.0
    seed: int = 2925
    #: None: the region's default (uniform / correlated for the benchmark groups,
    #: around_default, scores drawn around each POI's own default score, for custom ones)
    score_kind: str | None = None
    val_every: int = 1_000  # epochs between greedy validations (0: only at the end)
    val_tourists: int = 64  # how many of the region's validation tourists to use
    checkpoint_every: int = 10_000  # epochs between checkpoints (0: only at the end)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    #: torch intra-op threads (None: the cores other work leaves free, optw.threads)
    threads: int | None = None
    #: the training rollout: auto | compact | static | graph (optw.train.rollouts)
    rollout: str = "auto"
    #: learning from demonstrations (ILS routes; docs/recipes.md)
    demos: int = 0
    imitation_epochs: int = 0
    imitation_batch: int = 32
    imitation_lr: float = 1e-3
    #: REINFORCE epochs draw their tourists from the demonstrations
    demo_tourists: bool = False
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig overrides

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def need(cond: bool, name: str, what: str) -> None:
            require(cond, name, getattr(self, name), what)

        if isinstance(self.regions, str):
            self.regions = [self.regions]
        need(isinstance(self.regions, list) and all(isinstance(r, str) and r
                                                    for r in self.regions),
             "regions", "must be a list of region ids")
        need(integer(self.seed) and 0 <= self.seed <= MAX_SEED, "seed",
             f"must be an integer in 0..{MAX_SEED}")
        for name in ("epochs", "batch_size", "tourists_per_epoch", "lr_decay_every"):
            need(integer(getattr(self, name)) and 1 <= getattr(self, name) <= MAX_COUNT, name,
                 f"must be an integer in 1..{MAX_COUNT:,}")
        routes = self.batch_size * self.tourists_per_epoch
        need(routes <= MAX_ROUTES, "batch_size" if self.batch_size >= self.tourists_per_epoch
             else "tourists_per_epoch", f"{routes:,} routes per epoch (batch_size × "
             f"tourists_per_epoch); at most {MAX_ROUTES:,}")
        need(integer(self.imitation_batch) and 1 <= self.imitation_batch <= MAX_ROUTES,
             "imitation_batch", f"must be an integer in 1..{MAX_ROUTES:,} (routes per "
             "imitation step)")
        for name in ("val_every", "checkpoint_every", "warmup_epochs", "imitation_epochs"):
            need(integer(getattr(self, name)) and 0 <= getattr(self, name) <= MAX_COUNT, name,
                 f"must be an integer in 0..{MAX_COUNT:,}")
        need(integer(self.val_tourists) and 0 <= self.val_tourists <= VALIDATION_SIZE,
             "val_tourists", f"must be an integer in 0..{VALIDATION_SIZE} (the validation "
             "tourists each region has)")
        need(integer(self.demos) and 0 <= self.demos <= MAX_DEMOS, "demos",
             f"must be an integer in 0..{MAX_DEMOS:,}")
        for name in ("demo_tourists", "finetune", "mix_regions"):
            need(type(getattr(self, name)) is bool, name, "must be true or false")
        need(self.demos > 0 or not (self.imitation_epochs or self.demo_tourists), "demos",
             "imitation_epochs and demo_tourists need demonstrations (demos >= 1)")
        need(self.demos == 0 or self.imitation_epochs or self.demo_tourists, "demos",
             "demonstrations are used by imitation_epochs or demo_tourists: set one")
        for name in ("lr", "lr_min", "finetune_lr", "imitation_lr"):
            need(number(getattr(self, name)) and 0 < getattr(self, name) <= MAX_LR, name,
                 f"must be a number in (0, {MAX_LR:g}] (Adam's step size)")
        need(number(self.max_grad_norm) and 0 < self.max_grad_norm <= 1e6, "max_grad_norm",
             "must be a number in (0, 1e6]")
        need(number(self.lr_decay) and 0 < self.lr_decay <= 1, "lr_decay", "must be in (0, 1]")
        need(number(self.beta) and 0 <= self.beta <= MAX_BETA, "beta",
             f"must be a number in 0..{MAX_BETA:g}")
        need(self.advantage in ADVANTAGES, "advantage", f"must be one of {list(ADVANTAGES)}")
        need(self.lr_schedule in LR_SCHEDULES, "lr_schedule",
             f"must be one of {list(LR_SCHEDULES)}")
        need(self.recipe in RECIPES, "recipe", f"must be one of {sorted(RECIPES)}")
        need(self.max_minutes is None or (number(self.max_minutes)
                                          and 0 < self.max_minutes <= MAX_MINUTES),
             "max_minutes", f"must be a number in (0, {MAX_MINUTES:,}] or unset")
        need(self.lr_schedule not in ("cosine_time", "cosine_budget")
             or self.max_minutes is not None, "lr_schedule",
             f"{self.lr_schedule} decays over max_minutes: set max_minutes")
        need(self.score_kind is None or self.score_kind in SCORE_KINDS, "score_kind",
             f"must be one of {list(SCORE_KINDS)} or unset")
        need(isinstance(self.device, str) and (self.device in ("auto", "cpu", "cuda") or (
            self.device.startswith("cuda:") and self.device[5:].isdigit())), "device",
             "must be auto, cpu, cuda or cuda:N")
        need(self.threads is None or (integer(self.threads) and 1 <= self.threads <= MAX_THREADS),
             "threads", f"must be an integer in 1..{MAX_THREADS} or unset")
        need(self.rollout in ROLLOUTS, "rollout", f"must be one of {list(ROLLOUTS)}")
        need(isinstance(self.model, dict), "model", "must be a table of model settings")
        known = sorted(f.name for f in dataclasses.fields(ModelConfig))
        unknown = sorted(set(self.model) - set(known))
        need(not unknown, "model", f"unknown key(s) {unknown}; known keys: {known}")
        try:
            ModelConfig(**self.model)
        except ConfigError as exc:  # "d_model = 0: ..." -> "model.d_model = 0: ..."
            raise ConfigError(f"model.{exc}", f"model.{exc.key}") from None

    @property
    def total_epochs(self) -> int:
        """Every epoch of the run: imitation, then REINFORCE."""
        return self.imitation_epochs + self.epochs

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> TrainConfig:
        """Build from a table; ``recipe = "fast"`` fills every key the table leaves out from
        that recipe's preset (:data:`RECIPES`)."""
        recipe = data.get("recipe", "paper")
        if recipe not in RECIPES:
            raise ConfigError(f"{source}: recipe = {recipe!r}: must be one of {sorted(RECIPES)}")
        return from_table(cls, {**RECIPES[recipe], **data}, source)

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def hash_dict(self, exclude: tuple[str, ...] = ("device", "threads")) -> dict[str, Any]:
        """The settings that change the result; settings added since the first release are
        left out while at their defaults, so earlier configs keep their hashes."""
        return {k: v for k, v in self.to_dict().items() if k not in exclude
                and not (k in ADDED_DEFAULTS and v == ADDED_DEFAULTS[k])}

    def config_hash(self) -> str:
        """Stable short hash of the settings that change the result."""
        d = self.hash_dict()
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def learning_rate(self, epoch: int, train_s: float = 0.0, start_s: float = 0.0) -> float:
        """The REINFORCE lr at its ``epoch`` (counted after the imitation epochs) by
        ``lr_schedule``, floored at lr_min, after the warm-up; ``train_s``:
        seconds trained so far, ``start_s`` of them before REINFORCE began."""
        if self.finetune:
            return self.finetune_lr
        if self.lr_schedule in ("cosine", "cosine_time", "cosine_budget"):
            by_epoch = epoch / max(self.epochs, 1)
            budget = 60 * (self.max_minutes or math.inf) - start_s
            by_time = (train_s - start_s) / budget if budget > 0 else 1.0
            frac = {"cosine": by_epoch, "cosine_time": by_time}.get(self.lr_schedule,
                                                                   max(by_epoch, by_time))
            frac = min(frac, 1.0)
            lr = self.lr_min + 0.5 * (self.lr - self.lr_min) * (1 + math.cos(math.pi * frac))
        else:
            lr = max(self.lr_min, self.lr * self.lr_decay ** (epoch // self.lr_decay_every))
        if epoch < self.warmup_epochs:
            lr *= (epoch + 1) / self.warmup_epochs
        return lr


LR_SCHEDULES = ("step", "cosine", "cosine_time", "cosine_budget")
ADVANTAGES = ("mean", "normalised")
#: Named presets of training settings (``[train] recipe = "..."``; keys given beside it win).
#: ``paper``: the defaults above. ``fast``: more, cheaper and larger steps, which learn sooner
#: per sampled route; docs/recipes.md says how each departs from the paper, and what it gives.
RECIPES: dict[str, dict[str, Any]] = {
    "paper": {},
    "fast": {"tourists_per_epoch": 1, "batch_size": 8, "lr": 1e-3, "lr_min": 1e-5,
             "lr_schedule": "cosine"},
    "imitate": {"tourists_per_epoch": 1, "batch_size": 8, "lr": 1e-3, "lr_min": 1e-5,
                "lr_schedule": "cosine", "demos": 512, "imitation_epochs": 100,
                "imitation_batch": 16, "imitation_lr": 1e-3},
}

#: Settings added after the first release; their field defaults keep the paper's behaviour.
ADDED = ("mix_regions", "lr_schedule", "warmup_epochs", "recipe", "max_minutes", "rollout",
         "demos", "imitation_epochs", "imitation_batch", "imitation_lr", "demo_tourists",
         "advantage")
#: Those settings with their defaults (left out of a config's hash while at them).
ADDED_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(TrainConfig)
                                  if f.name in ADDED}


def machine_memory() -> int:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max",
                       "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def check_fits(config: TrainConfig, n_nodes: int, where: str = "config") -> None:
    """A :class:`ConfigError` naming the setting (``batch_size`` and ``tourists_per_epoch``, or
    ``imitation_batch``) when a REINFORCE epoch or an imitation step of ``config`` on regions of
    up to ``n_nodes`` nodes would need more than 80 % of the :func:`machine_memory`, at
    :data:`ROW_BYTES` per node row."""
    memory = machine_memory()
    steps = [(config.batch_size * config.tourists_per_epoch, "batch_size",
              f"batch_size = {config.batch_size} × tourists_per_epoch = "
              f"{config.tourists_per_epoch}", "batch_size or tourists_per_epoch", "epoch")]
    if config.imitation_epochs:
        steps.append((config.imitation_batch, "imitation_batch",
                      f"imitation_batch = {config.imitation_batch}", "imitation_batch",
                      "imitation step"))
    for routes, key, what, lower, per in steps:
        need = routes * n_nodes * ROW_BYTES
        if need > 0.8 * memory:
            raise ConfigError(
                f"{where}: {what} routes of {n_nodes} nodes need about {need / 2**30:,.1f} GiB "
                f"per {per}, more than this machine's {memory / 2**30:.1f} GiB allow; lower "
                f"{lower}", key)


def check_devices(config: TrainConfig, cuda_devices: int, where: str = "config") -> None:
    """A :class:`ConfigError` naming ``device`` or ``rollout`` when ``config`` cannot train
    where it will run, with ``cuda_devices`` CUDA devices there (a job's worker: 1 on a
    cluster with GPUs, else 0); ``where`` names the source (a file and table, or an option)."""
    device = config.device
    if device.startswith("cuda"):
        index = int(device[5:]) if device.startswith("cuda:") else 0
        if index >= cuda_devices:
            has = "no CUDA device" if not cuda_devices else f"{cuda_devices} CUDA device(s)"
            raise ConfigError(f"{where}: device = {device!r}: where it trains there is {has}; "
                              "use cpu or auto", "device")
    if config.rollout == "graph" and (device == "cpu" or not cuda_devices):
        raise ConfigError(f"{where}: rollout = 'graph' replays CUDA graphs, but this run "
                          "trains on the CPU; use auto, compact or static, or a CUDA device",
                          "rollout")
