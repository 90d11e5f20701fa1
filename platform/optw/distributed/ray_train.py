"""One region (or one global model) = one Ray Train run: a TorchTrainer with one worker.

The worker runs :func:`optw.train.train` with two extra callbacks: :class:`RayReport` (metrics
and checkpoints to Ray Train, so a restarted worker resumes from its last checkpoint) and the
MLflow callback (metrics to the stage's child run). Ray metrics for the dashboard are exported
through ``ray.util.metrics`` (see ``dashboards/``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from optw.model import write_checkpoint
from optw.train.callbacks import Callback, TrainContext

CHECKPOINT_FILE = "last.pt"
#: A worker that imports torch on a busy 2-core machine can take more than Ray Train's default
#: 60 s to join its group; a timed-out start can leak its placement group. Set before Ray starts
#: (processes of a local cluster inherit it; `jobs/embedded.sh` sets it for `ray start`).
WORKER_START_TIMEOUT_ENV = ("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "600")


#: Ray Train's preemption watcher (one more actor process per run) only matters on clusters of
#: preemptible nodes; a local cluster started by the job switches it off.
LOCAL_PREEMPTION_ENV = ("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")


def configure_ray_env() -> None:
    """Environment Ray Train reads in its controller; call before a local ``ray.init``."""
    os.environ.setdefault(*WORKER_START_TIMEOUT_ENV)
    os.environ.setdefault(*LOCAL_PREEMPTION_ENV)


def gap_to_ils(metrics: dict[str, float], ils_means: dict[str, float]) -> float | None:
    """Mean over regions of (ILS − model)/ILS × 100 on the validation tourists (negative:
    better than ILS); a score-free measure that compares across regions."""
    gaps = []
    for rid, ils in ils_means.items():
        score = metrics.get(f"val_score/{rid}", metrics.get("val_score"))
        if score is not None and ils > 0:
            gaps.append((ils - score) / ils * 100.0)
    return float(sum(gaps) / len(gaps)) if gaps else None


class RayReport(Callback):
    """Reports metrics every ``every`` epochs and a checkpoint every ``checkpoint_every``
    epochs and at the end through ``ray.train.report``; exports Ray metrics (gauges).

    With ``ils_means`` (mean ILS score of each region's validation tourists) every validation
    adds ``val_gap_ils`` and is reported at once (Tune's schedulers compare trials on it)."""

    def __init__(self, every: int, checkpoint_every: int, tags: dict[str, str],
                 ils_means: dict[str, float] | None = None):
        self.every, self.checkpoint_every, self.tags = max(1, every), checkpoint_every, tags
        self.ils_means = ils_means or {}
        self._gauges: dict[str, Any] | None = None

    def _gauge(self, name: str, value: float) -> None:
        try:
            from ray.util.metrics import Gauge

            if self._gauges is None:
                self._gauges = {}
            if name not in self._gauges:
                self._gauges[name] = Gauge(f"optw_{name}", description=f"optw training {name}",
                                           tag_keys=tuple(self.tags))
            self._gauges[name].set(float(value), tags=self.tags)
        except Exception:  # metrics are best effort: never break training for them
            pass

    def _report(self, ctx: TrainContext, metrics: dict[str, float], checkpoint: bool) -> None:
        import ray.train

        metrics = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        metrics["epoch"] = ctx.epoch
        if not checkpoint:
            ray.train.report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="optw-ckpt-") as tmp:
            write_checkpoint(ctx.snapshot(), Path(tmp) / CHECKPOINT_FILE)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))

    def on_epoch_end(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        for key in ("epochs_per_s", "mean_reward"):
            self._gauge(key, metrics[key])
        ckpt = bool(self.checkpoint_every) and ctx.epoch % self.checkpoint_every == 0
        # the final report (with the final checkpoint) comes from on_train_end
        if (ckpt or ctx.epoch % self.every == 0) and ctx.epoch < ctx.total_epochs:
            self._report(ctx, metrics, ckpt)

    def on_validation(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        self._gauge("val_score", metrics["val_score"])
        gap = gap_to_ils(metrics, self.ils_means)
        if gap is not None:
            metrics["val_gap_ils"] = gap  # kept in ctx.last_validation too
            self._gauge("val_gap_ils", gap)
            if ctx.epoch < ctx.total_epochs:
                self._report(ctx, metrics, checkpoint=False)

    def on_train_end(self, ctx: TrainContext) -> None:
        self._report(ctx, {**ctx.last_validation, "final": 1.0}, checkpoint=True)


def train_worker(cfg: dict[str, Any]) -> None:
    """The Ray Train worker function (runs in the TorchTrainer's single worker process)."""
    import ray.train
    import torch

    from optw.catalog import open_catalog
    from optw.model import read_checkpoint
    from optw.tracking import MlflowCallback
    from optw.train import TrainConfig, train

    config = TrainConfig.from_dict(cfg["train"])
    if config.threads:
        torch.set_num_threads(config.threads)
    resume = None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:  # a restarted worker, or a re-run of a crashed job
        with checkpoint.as_directory() as folder:
            resume = read_checkpoint(Path(folder) / CHECKPOINT_FILE)
    callbacks: list[Callback] = [
        RayReport(every=cfg.get("report_every", 50), checkpoint_every=config.checkpoint_every,
                  tags={"region": cfg["key"], "stage": cfg["stage"]},
                  ils_means=cfg.get("ils_means")),
        MlflowCallback(cfg["run_id"], uri=cfg["tracking_uri"], log_every=cfg.get("log_every", 10),
                       log_checkpoint=False),
    ]
    if cfg.get("pause_after_checkpoint"):
        callbacks.append(_PauseAfterCheckpoint(cfg["pause_after_checkpoint"]))
    train(config, open_catalog(cfg["catalog"]), callbacks, init=cfg.get("init"), resume=resume)


def ils_validation_means(catalog_dir: str, regions: list[str], n_tourists: int) -> dict:
    """Mean stored ILS score over each region's first ``n_tourists`` validation tourists."""
    from optw.baselines import load_ils_results

    ils = load_ils_results(catalog_dir)
    val = ils[(ils["kind"] == "validation") & ils["region"].isin(regions)
              & (ils["tourist"] <= n_tourists)]
    return {str(k): float(v) for k, v in val.groupby("region")["score"].mean().items()}


class _PauseAfterCheckpoint(Callback):
    """Test hook: after the first checkpoint, write a marker file and sleep, so a test can
    SIGKILL this worker at a known point."""

    def __init__(self, marker: str):
        self.marker = Path(marker)

    def on_epoch_end(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        import time

        every = ctx.config.checkpoint_every
        if every and ctx.epoch == every and not self.marker.exists():
            self.marker.write_text(str(os.getpid()))
            time.sleep(120)


def make_trainer(cfg: dict[str, Any], storage: str, name: str, use_gpu: bool, cpus: float,
                 gpu_fraction: float, max_failures: int, callbacks: list | None = None):
    """A TorchTrainer with one worker running :func:`train_worker` on ``cfg``."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    resources = {"CPU": cpus}
    if use_gpu:
        resources["GPU"] = gpu_fraction
    return TorchTrainer(
        train_worker,
        train_loop_config=cfg,
        scaling_config=ScalingConfig(num_workers=1, use_gpu=use_gpu,
                                     resources_per_worker=resources),
        run_config=RunConfig(name=name, storage_path=storage, callbacks=callbacks,
                             failure_config=FailureConfig(max_failures=max_failures,
                                                          controller_failure_limit=2)),
    )


def fit_region(cfg: dict[str, Any], storage: str, name: str, use_gpu: bool,
               cpus: float, gpu_fraction: float, max_failures: int, out: str) -> str:
    """Run one TorchTrainer to completion and copy its final checkpoint to ``out``.

    Re-running with the same ``name`` and ``storage`` resumes from the last checkpoint that
    run reported (Ray Train restores by run name), so a crashed job continues.
    """
    trainer = make_trainer(cfg, storage, name, use_gpu, cpus, gpu_fraction, max_failures)
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"{name}: training finished without a checkpoint")
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with result.checkpoint.as_directory() as folder:
        tmp = out_path.with_name(f".{out_path.name}.tmp")
        shutil.copyfile(Path(folder) / CHECKPOINT_FILE, tmp)
        os.replace(tmp, out_path)
    return str(out_path)
