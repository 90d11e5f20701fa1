"""One region (or one global model) = one Ray Train run: a TorchTrainer with one worker.

The worker gets a typed :class:`WorkerSpec` and runs :func:`optw.train.train` with two extra
callbacks: :class:`RayReport` (metrics and checkpoints to Ray Train, so a restarted worker
resumes from its last checkpoint) and the MLflow callback (metrics to the stage's child run),
plus the spec's own. Ray metrics for the dashboard are exported through ``ray.util.metrics``
(see ``dashboards/``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optw.distributed.profile import ResourcesSection
from optw.evaluate.protocol import gap_to_ils, ils_validation_means
from optw.model import write_checkpoint
from optw.train.callbacks import Callback, TrainContext
from optw.train.config import TrainConfig

CHECKPOINT_FILE = "last.pt"
#: epochs between metric reports to Ray Train / MLflow log points in a worker
REPORT_EVERY, LOG_EVERY = 50, 10
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


@dataclass(frozen=True)
class WorkerSpec:
    """Everything one Ray Train worker needs, typed; built by :meth:`build` (the job and Tune
    alike) and handed to the worker as it is.

    ``callbacks`` are extra training callbacks (picklable) the worker adds to its own."""

    config: TrainConfig
    key: str  # region id, or global-<group> / transfer-<group>, or the Tune regions
    stage: str  # scratch | global | finetune | tune
    catalog: str
    tracking_uri: str
    run_id: str | None  # the MLflow child run the worker logs to (None: Tune sets it per trial)
    init: str | None = None  # a model file to start from (fine-tuning)
    ils_means: Mapping[str, float] = field(default_factory=dict)
    report_every: int = REPORT_EVERY
    log_every: int = LOG_EVERY
    callbacks: tuple[Callback, ...] = ()

    @classmethod
    def build(cls, config: TrainConfig, key: str, stage: str, *, catalog: str,
              tracking_uri: str, run_id: str | None, init: str | None = None,
              callbacks: Sequence[Callback] = ()) -> WorkerSpec:
        """The spec of a model trained with ``config`` (its regions' ILS means looked up)."""
        means = ils_validation_means(catalog, config.regions, config.val_tourists)
        return cls(config, key, stage, str(catalog), tracking_uri, run_id, init, means,
                   callbacks=tuple(callbacks))

    def replace(self, **changes: Any) -> WorkerSpec:
        return dataclasses.replace(self, **changes)


def train_worker(loop_config: dict[str, WorkerSpec]) -> None:
    """The Ray Train worker function (runs in the TorchTrainer's single worker process)."""
    import ray.train
    import torch

    from optw.catalog import open_catalog
    from optw.model import read_checkpoint
    from optw.tracking import MlflowCallback
    from optw.train import train

    spec = loop_config["spec"]
    config = spec.config
    if config.threads:
        torch.set_num_threads(config.threads)
    resume = None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:  # a restarted worker, or a re-run of a crashed job
        with checkpoint.as_directory() as folder:
            resume = read_checkpoint(Path(folder) / CHECKPOINT_FILE)
    callbacks: list[Callback] = [
        RayReport(every=spec.report_every, checkpoint_every=config.checkpoint_every,
                  tags={"region": spec.key, "stage": spec.stage}, ils_means=spec.ils_means),
        MlflowCallback(spec.run_id, uri=spec.tracking_uri, log_every=spec.log_every,
                       log_checkpoint=False),
        *spec.callbacks,
    ]
    train(config, open_catalog(spec.catalog), callbacks, init=spec.init, resume=resume)


def make_trainer(spec: WorkerSpec, storage: str, name: str, resources: ResourcesSection,
                 use_gpu: bool, max_failures: int | None = None, callbacks: list | None = None):
    """A TorchTrainer with one worker running :func:`train_worker` on ``spec``."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    per_worker = {"CPU": resources.cpus_per_region}
    if use_gpu:
        per_worker["GPU"] = resources.gpu_fraction
    failures = resources.max_failures if max_failures is None else max_failures
    return TorchTrainer(
        train_worker,
        train_loop_config={"spec": spec},
        scaling_config=ScalingConfig(num_workers=1, use_gpu=use_gpu,
                                     resources_per_worker=per_worker),
        run_config=RunConfig(name=name, storage_path=storage, callbacks=callbacks,
                             failure_config=FailureConfig(max_failures=failures,
                                                          controller_failure_limit=2)),
    )


def fit_region(spec: WorkerSpec, storage: str, name: str, resources: ResourcesSection,
               use_gpu: bool, out: str) -> str:
    """Run one TorchTrainer to completion and copy its final checkpoint to ``out``.

    Re-running with the same ``name`` and ``storage`` resumes from the last checkpoint that
    run reported (Ray Train restores by run name), so a crashed job continues.
    """
    result = make_trainer(spec, storage, name, resources, use_gpu).fit()
    if result.checkpoint is None:
        raise RuntimeError(f"{name}: training finished without a checkpoint")
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with result.checkpoint.as_directory() as folder:
        tmp = out_path.with_name(f".{out_path.name}.tmp")
        shutil.copyfile(Path(folder) / CHECKPOINT_FILE, tmp)
        os.replace(tmp, out_path)
    return str(out_path)
