"""Long pretraining of a group's global model (``optw pretrain``; docs/releases.md).

One process trains the group's global model with the profile's ``[train]`` table on all the
group's regions, for a budget of CPU hours, and can be stopped at any moment: it checkpoints
``last.pt`` every ``checkpoint_every`` epochs and resumes from it exactly (weights, Adam,
schedule, RNG streams). Every ``curve_every`` epochs it appends a row to ``curve.csv``: the
training CPU hours so far (all sessions together), the routes seen, the lr, and greedy and
beam-8 gaps to ILS on the validation tourists of the group's curve regions.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optw.checks import from_table, integer, load_mapping, require
from optw.errors import UserError
from optw.paths import PROJECT_ROOT, file_sha256, write_text_atomic
from optw.train.callbacks import Callback, TrainContext

#: The pretraining profile that ships with the package.
DEFAULT_PROFILE = Path(__file__).with_name("profiles") / "pretrain.toml"
#: Where each group's pretraining state (``last.pt``, ``curve.csv``, ``progress.json``) lives.
PRETRAIN_DIR = PROJECT_ROOT / "pretraining"
#: Validation tourists decoded at once by a curve point or a release's evaluation.
EVAL_CHUNK = 16


@dataclass
class PretrainSettings:
    """A pretraining profile's ``[pretrain]`` table."""

    checkpoint_every: int = 50  # epochs between checkpoints (what an interruption can lose)
    curve_every: int = 200  # epochs between points of the learning curve
    curve_tourists: int = 64  # validation tourists per curve region
    beams: int = 8  # the curve's beam width (beside greedy)
    cooldown: float = 0.2  # a release's lr decay: this share of the epochs trained ...
    cooldown_max: int = 1500  # ... but at most this many epochs
    #: group -> regions evaluated at each curve point (the release evaluates every region)
    curve_regions: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("checkpoint_every", "curve_every", "curve_tourists", "beams"):
            value = getattr(self, name)
            require(integer(value) and 1 <= value <= 10**9, f"pretrain.{name}", value,
                    "must be a positive integer")
        require(isinstance(self.cooldown, (int, float)) and 0 <= self.cooldown <= 1,
                "pretrain.cooldown", self.cooldown, "must be a number in 0..1")
        require(integer(self.cooldown_max) and self.cooldown_max >= 0, "pretrain.cooldown_max",
                self.cooldown_max, "must be an integer >= 0")
        require(self.curve_tourists <= 64, "pretrain.curve_tourists", self.curve_tourists,
                "must be at most 64 (the validation tourists of a region)")
        require(isinstance(self.curve_regions, dict) and all(
            isinstance(v, list) and v and all(isinstance(r, str) for r in v)
            for v in self.curve_regions.values()), "pretrain.curve_regions",
            self.curve_regions, "must map each group to a list of region ids")


def load_pretrain_profile(path: str | Path | None = None) -> tuple[dict[str, Any],
                                                                   PretrainSettings]:
    """The profile's ``[train]`` table (a ``TrainConfig`` without regions) and its
    ``[pretrain]`` settings; unknown tables are errors naming the file."""
    path = Path(path or DEFAULT_PROFILE)
    data = load_mapping(path)
    unknown = sorted(set(data) - {"train", "pretrain"})
    if unknown:
        raise UserError(f"{path}: unknown table(s) {unknown}; expected [train] and [pretrain]")
    return dict(data.get("train", {})), from_table(PretrainSettings, data.get("pretrain", {}),
                                                   str(path))


def group_regions(catalog: Any, group: str) -> list[str]:
    """The group's regions in catalog order (an unknown group is an error naming it)."""
    table = catalog.regions_table
    regions = [str(r) for r in table.index[table["group"] == group]]
    if not regions:
        groups = sorted(set(table["group"]))
        raise UserError(f"--group {group}: no such group in the catalog (groups: "
                        f"{', '.join(groups)})")
    return regions


def gaps_above_ils(model: Any, catalog: Any, regions: list[str], ils: dict[str, float],
                   tourists: int, beams: int, bar: str | None = None,
                   ) -> dict[str, dict[str, float]]:
    """Per region: greedy and beam mean on its first ``tourists`` validation tourists, in %
    above the ILS mean on the same tourists (negative: below ILS); ``bar``: a progress bar's
    label (none without)."""
    from tqdm import tqdm

    from optw.allocator import release_free_memory
    from optw.decode import solve

    out = {}
    for rid in tqdm(regions, desc=bar, unit="region", disable=bar is None, file=sys.stderr):
        region, val = catalog.region(rid), catalog.validation(rid)[:tourists]
        greedy, beam = [], []
        for k in range(0, len(val), EVAL_CHUNK):  # a few GB at most on the largest regions
            part = val[k:k + EVAL_CHUNK]
            greedy += (g := solve(model, region, part, "greedy"))
            beam += solve(model, region, part, "beam", beams=beams, greedy=g)
        out[rid] = {name: 100.0 * (float(np.mean([s.score for s in sols])) / ils[rid] - 1.0)
                    for name, sols in (("greedy", greedy), ("beam", beam))}
    release_free_memory()  # a long run keeps no evaluation's peak
    return out


def ils_means(catalog: Any, regions: list[str], tourists: int) -> dict[str, float]:
    """Stored ILS means of the regions' first validation tourists, computing missing ones."""
    from optw.baselines import run_ils_baseline
    from optw.evaluate.protocol import ils_validation_means

    means = ils_validation_means(str(catalog.path), regions, tourists)
    if set(means) != set(regions):
        run_ils_baseline(catalog.path, regions=regions, tourists="validation", workers=1,
                         progress=False)
        means = ils_validation_means(str(catalog.path), regions, tourists)
    return means


class PretrainProgress(Callback):
    """Checkpoints, the learning curve and the CPU budget of one ``optw pretrain`` call.

    Training CPU time is the process's CPU time less what checkpoints and curve points took,
    added to the ``cpu_s`` that the resumed checkpoint carries (earlier calls); the call
    stops, checkpointed, once it has trained ``budget_s`` CPU seconds. ``evaluate(model)``:
    per-region gaps of a copy of the model (:func:`gaps_above_ils`)."""

    def __init__(self, out: Path, settings: PretrainSettings, budget_s: float,
                 evaluate: Any, routes_per_epoch: int, before: dict[str, Any]):
        self.out, self.settings, self.budget_s = out, settings, budget_s
        self.evaluate, self.routes_per_epoch = evaluate, routes_per_epoch
        self.before = before  # the resumed checkpoint's "pretrain" entry
        self.t0 = self.aside = 0.0
        self.lr = float("nan")

    @property
    def spent_s(self) -> float:
        """Training CPU seconds of this call."""
        return time.process_time() - self.t0 - self.aside

    @property
    def cpu_s(self) -> float:
        """Training CPU seconds of the model so far, all calls together."""
        return float(self.before.get("cpu_s", 0.0)) + self.spent_s

    def on_train_start(self, ctx: TrainContext) -> None:
        self.t0 = time.process_time()

    def on_epoch_end(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        self.lr = metrics.get("lr", self.lr)
        s = self.settings
        done = self.spent_s >= self.budget_s
        if ctx.epoch % s.curve_every == 0:
            self._curve_point(ctx)
        if done or ctx.epoch % s.checkpoint_every == 0 or ctx.epoch == ctx.total_epochs:
            self._checkpoint(ctx)
        ctx.stop = ctx.stop or done

    def _aside(self, fn: Any) -> Any:
        t = time.process_time()
        try:
            return fn()
        finally:
            self.aside += time.process_time() - t

    def _checkpoint(self, ctx: TrainContext) -> None:
        from optw.allocator import release_free_memory
        from optw.model import write_checkpoint

        progress = {"epoch": ctx.epoch, "cpu_s": round(self.cpu_s, 1),
                    "routes": ctx.epoch * self.routes_per_epoch}
        if "lr_steps" in self.before:
            progress["lr_steps"] = self.before["lr_steps"]

        def write() -> None:  # the checkpoint carries its CPU time: one atomic write
            assert ctx.snapshot is not None
            write_checkpoint({**ctx.snapshot(), "pretrain": progress}, self.out / "last.pt")
            ctx.last_checkpoint = self.out / "last.pt"
        self._aside(write)
        write_text_atomic(self.out / "progress.json", json.dumps(progress, indent=1) + "\n")
        release_free_memory()  # epochs of varying shapes leave the heap fragmented

    def _curve_point(self, ctx: TrainContext) -> None:
        from optw.model import ModelConfig, PointerNet

        def evaluate() -> dict[str, dict[str, float]]:
            assert ctx.snapshot is not None
            snap = ctx.snapshot()  # a copy: evaluating it leaves training untouched
            model = PointerNet(ModelConfig.from_dict(snap["config"]))
            model.load_state_dict(snap["state_dict"])
            return self.evaluate(model)
        gaps = self._aside(evaluate)
        row = {"epoch": ctx.epoch, "routes": ctx.epoch * self.routes_per_epoch,
               "cpu_hours": round(self.cpu_s / 3600, 4), "lr": f"{self.lr:.3g}",
               "greedy_above_ils": round(float(np.median([g["greedy"] for g in gaps.values()])),
                                         3),
               "beam_above_ils": round(float(np.median([g["beam"] for g in gaps.values()])), 3)}
        row.update({f"{m}/{rid}": round(g[m], 3) for rid, g in gaps.items()
                    for m in ("greedy", "beam")})
        append_curve(self.out / "curve.csv", row)
        print(f"epoch {ctx.epoch}: {row['cpu_hours']:.2f} CPU-h, greedy "
              f"{row['greedy_above_ils']:+.2f} %, beam {self.settings.beams} "
              f"{row['beam_above_ils']:+.2f} % against ILS (median of "
              f"{len(gaps)} regions)", flush=True)


def append_curve(path: Path, row: dict[str, Any]) -> None:
    """Append ``row`` to the curve CSV (its rows past ``row['epoch']`` dropped: a resumed run
    redoes them), rewriting it atomically."""
    rows = read_curve(path)
    rows = [r for r in rows if int(r["epoch"]) < int(row["epoch"])] + [row]
    fields = list(dict.fromkeys(k for r in rows for k in r))
    lines: list[str] = []

    class Sink:
        def write(self, text: str) -> None:
            lines.append(text)

    writer = csv.DictWriter(Sink(), fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, "".join(lines))


def read_curve(path: Path) -> list[dict[str, Any]]:
    """The rows of a pretraining curve (none if it does not exist yet)."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def pretrain(group: str, hours: float, out: Path | None = None, profile: str | Path | None = None,
             catalog_dir: str | Path | None = None, epochs: int | None = None,
             lr: float | None = None) -> dict[str, Any]:
    """Train ``group``'s global model for ``hours`` more CPU hours (or up to ``epochs`` in all),
    resuming ``out/last.pt`` when it exists; returns ``progress.json``'s content. ``lr``: the
    lr from now on (a resumed state otherwise keeps its own; each change is kept in the
    state's ``lr_steps``)."""
    import torch

    from optw.catalog import open_catalog
    from optw.model import read_checkpoint
    from optw.train import TrainConfig, train

    catalog = open_catalog(catalog_dir)
    table, settings = load_pretrain_profile(profile)
    regions = group_regions(catalog, group)
    out = Path(out or PRETRAIN_DIR / group)
    last = out / "last.pt"
    state = read_checkpoint(last) if last.exists() else None
    given = {**table, "regions": regions, "val_every": 0, "checkpoint_every": 0}
    was = None if state is None else state["train"]["config"]["lr"]
    if lr is not None or was is not None:  # a resumed run keeps its lr unless stepped
        given["lr"] = lr if lr is not None else was
    if epochs is not None:
        given["epochs"] = epochs
    config = TrainConfig.from_dict(given, source=str(profile or DEFAULT_PROFILE))
    out.mkdir(parents=True, exist_ok=True)
    curve_regions = settings.curve_regions.get(group) or regions[:: max(1, len(regions) // 4)]
    for rid in curve_regions:
        catalog.region(rid)  # an unknown region is an error naming it
    ils = ils_means(catalog, curve_regions, settings.curve_tourists)
    torch.set_num_threads(config.threads or 1)

    def evaluate(model: Any) -> dict[str, dict[str, float]]:
        return gaps_above_ils(model, catalog, curve_regions, ils, settings.curve_tourists,
                              settings.beams)

    before = dict((state or {}).get("pretrain", {}))
    steps = [list(x) for x in before.get("lr_steps", [[0, was or config.lr]])]  # [epoch, lr]
    if was is not None and was != config.lr:
        assert state is not None
        print(f"{group}: lr {was:g} -> {config.lr:g} from epoch {state['train']['epoch']}",
              flush=True)
        steps.append([int(state["train"]["epoch"]), config.lr])
    progress = PretrainProgress(out, settings, hours * 3600, evaluate,
                                config.batch_size * config.tourists_per_epoch,
                                {**before, "lr_steps": steps})
    train(config, catalog, callbacks=[progress], resume=state, resumable=("lr",))
    return json.loads((out / "progress.json").read_text())


def cooldown_epochs(epoch: int, settings: PretrainSettings) -> int:
    """Epochs of a release's lr decay after ``epoch`` epochs of pretraining."""
    return min(settings.cooldown_max, round(settings.cooldown * epoch))


def machine() -> str:
    """This machine in words: CPU model and cores, or the CUDA device."""
    import os
    import platform

    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, torch {torch.__version__}"


def make_release(group: str, state: Path | None = None, regions: list[str] | None = None,
                 profile: str | Path | None = None, catalog_dir: str | Path | None = None,
                 folder: Path | None = None, tracking_uri: str | None = None,
                 ) -> dict[str, Any]:
    """Cool a copy of ``state/last.pt`` down (a cosine decay of the lr over
    :func:`cooldown_epochs`, resumable in ``state/cooldown-<epoch>/``), evaluate it with greedy
    and beam search on the validation tourists of ``regions`` (default: every region of the
    group) against ILS, write ``<group>.pt`` and ``<group>.json`` to the releases folder and
    register it in MLflow as ``optw-global-<group>``, alias ``release``; returns the manifest."""
    import datetime

    import torch

    from optw.catalog import open_catalog
    from optw.model import read_checkpoint, save_model
    from optw.model.release import release_groups, release_manifest
    from optw.paths import releases_dir
    from optw.tracking.runs import git_commit
    from optw.train import ProgressBar, TrainConfig, train

    catalog = open_catalog(catalog_dir)
    _, settings = load_pretrain_profile(profile)
    state = Path(state or PRETRAIN_DIR / group)
    main = read_checkpoint(state / "last.pt")
    if "pretrain" not in main:
        raise UserError(f"{state / 'last.pt'} is not a pretraining checkpoint of `optw "
                        "pretrain`")
    done, table = main["pretrain"], dict(main["train"]["config"])
    if table["regions"] != group_regions(catalog, group):
        raise UserError(f"{state / 'last.pt'} was trained on other regions than group {group}")
    torch.set_num_threads(table.get("threads") or 1)
    n = cooldown_epochs(int(done["epoch"]), settings)
    branch = state / f"cooldown-{done['epoch']}"
    config = TrainConfig.from_dict({
        **table, "lr_schedule": "cosine", "epochs": max(n, 1),
        "warmup_epochs": min(20, n // 5), "val_every": 0, "checkpoint_every": 0,
        "val_tourists": 4}, source=f"cooldown of {state / 'last.pt'}")
    cool = {"epoch": 0, "cpu_s": 0.0}
    if n:
        last = branch / "last.pt"
        resume = read_checkpoint(last) if last.exists() else None
        tracker = PretrainProgress(branch, dataclasses.replace(
            settings, curve_every=10**9), float("inf"), None,
            config.batch_size * config.tourists_per_epoch, (resume or {}).get("pretrain", {}))
        result = train(config, catalog, resume=resume, init=None if resume else state / "last.pt",
                       callbacks=[tracker, ProgressBar(f"cooling {group} down")])
        cool = json.loads((branch / "progress.json").read_text())
        model = result.model
    else:
        from optw.model import load_model

        model = load_model(state / "last.pt")
    regions = regions or group_regions(catalog, group)
    for rid in regions:
        catalog.region(rid)
    ils = ils_means(catalog, regions, settings.curve_tourists)
    gaps = gaps_above_ils(model, catalog, regions, ils, settings.curve_tourists,
                          settings.beams, bar=f"evaluating {group}")
    folder = Path(folder or releases_dir())
    version = 1
    if group in release_groups(folder):
        version = int(release_manifest(group, folder).get("version", 0)) + 1
    weights = save_model(model, folder / f"{group}.pt")
    routes_per_epoch = config.batch_size * config.tourists_per_epoch
    manifest = {
        "group": group, "version": version, "file": weights.name,
        "sha256": file_sha256(weights), "architecture": model.cfg.to_dict(),
        "made": {"date": datetime.date.today().isoformat(), "commit": git_commit(),
                 "profile": str(profile or "pretrain"),
                 "profile_hash": TrainConfig.from_dict(table).config_hash(),
                 "machine": machine()},
        "training": {"epochs": int(done["epoch"]), "cooldown_epochs": int(cool["epoch"]),
                     "routes": int(done["epoch"] + cool["epoch"]) * routes_per_epoch,
                     "regions": len(table["regions"]),
                     "cpu_hours": round((done["cpu_s"] + cool["cpu_s"]) / 3600, 3),
                     "lr_steps": done.get("lr_steps", [[0, table["lr"]]]),
                     "training_tourists": "generated (seeded stream of the profile's seed; "
                                          "never a validation or benchmark tourist)"},
        "validation": {
            "tourists": settings.curve_tourists, "beams": settings.beams,
            "what": "mean score over each region's validation tourists, % above the ILS mean "
                    "on the same tourists (negative: below ILS)",
            "median_greedy_above_ils": round(float(np.median(
                [g["greedy"] for g in gaps.values()])), 3),
            "median_beam_above_ils": round(float(np.median(
                [g["beam"] for g in gaps.values()])), 3),
            "regions": {rid: {m: round(v, 4) for m, v in g.items()} for rid, g in gaps.items()}},
    }
    write_text_atomic(folder / f"{group}.json", json.dumps(manifest, indent=1) + "\n")
    if tracking_uri != "":
        from optw.tracking import register_release

        manifest_path = folder / f"{group}.json"
        register_release(group, weights, manifest_path, state / "curve.csv", uri=tracking_uri)
    return manifest
