"""One pack of models = one Ray Train run: a TorchTrainer whose one worker trains it."""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from optw.distributed import storage as st
from optw.distributed.mirror import local_catalog
from optw.distributed.plan import RELEASE_PREFIX
from optw.distributed.preflight import worker_need
from optw.distributed.profile import ResourcesSection
from optw.env.demos import Demonstrations
from optw.errors import OptwError
from optw.evaluate.protocol import gap_to_ils, ils_validation_means
from optw.model import write_checkpoint
from optw.model.release import checked_release
from optw.raylogs import quiet_train_worker, train_log_level
from optw.train.callbacks import Callback, TrainContext
from optw.train.config import TrainConfig

PACK_FILE = "pack.json"
REPORT_EVERY, LOG_EVERY = 50, 10  # epochs between reports to Ray Train / MLflow log points


class WorkerError(OptwError):
    """A Ray Train worker stopped on an error meant for the user."""


class RayReport(Callback):
    """Reports metrics and checkpoints to Ray Train and sets Ray gauges; with ``ils_means``
    every validation adds ``val_gap_ils`` and is reported at once (for Tune)."""

    def __init__(self, every: int, checkpoint_every: int, tags: dict[str, str],
                 ils_means: Mapping[str, float] | None = None,
                 pack: PackCheckpoint | None = None, extra: dict[str, float] | None = None):
        self.every, self.checkpoint_every, self.tags = max(1, every), checkpoint_every, tags
        self.ils_means = dict(ils_means or {})
        self.pack = pack or PackCheckpoint()
        self.extra = extra or {}  # added to every report (the pack member, the start time)
        self._gauges: dict[str, Any] = {}

    def _gauge(self, name: str, value: float) -> None:
        with contextlib.suppress(Exception):  # metrics are best effort: never break training
            from ray.util.metrics import Gauge

            if name not in self._gauges:
                self._gauges[name] = Gauge(f"optw_{name}", description=f"optw training {name}",
                                           tag_keys=tuple(self.tags))
            self._gauges[name].set(float(value), tags=self.tags)

    def _report(self, ctx: TrainContext, metrics: dict[str, float], checkpoint: bool,
                final: bool = False) -> None:
        import ray.train

        metrics = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        metrics.update(self.extra, epoch=ctx.epoch)
        key = self.tags["region"]
        # members running side by side share one checkpoint, their leader's; a finished
        # member's model joins it (or the next one, while others still run)
        if final:
            self.pack.finish(key, ctx.snapshot())
            checkpoint = not self.pack.running
        elif checkpoint:
            checkpoint = next(iter(self.pack.running), None) == key  # the leader's
        if not checkpoint:
            ray.train.report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="optw-ckpt-") as tmp:
            self.pack.write(Path(tmp))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))

    def on_train_start(self, ctx: TrainContext) -> None:
        self.pack.running[self.tags["region"]] = ctx

    def on_epoch_end(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        for key in ("epochs_per_s", "mean_reward", "imitation_loss"):
            if key in metrics:  # an imitation epoch has no reward, REINFORCE no imitation
                self._gauge(key, metrics[key])
        ckpt = bool(self.checkpoint_every) and ctx.epoch % self.checkpoint_every == 0
        # the final report comes from on_train_end
        if (ckpt or ctx.epoch % self.every == 0) and ctx.epoch < ctx.total_epochs:
            self._report(ctx, metrics, ckpt)

    def on_validation(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        self._gauge("val_score", metrics["val_score"])
        if (gap := gap_to_ils(metrics, self.ils_means)) is not None:
            metrics["val_gap_ils"] = gap  # kept in ctx.last_validation too
            self._gauge("val_gap_ils", gap)
            if ctx.epoch < ctx.total_epochs:
                self._report(ctx, metrics, checkpoint=False)

    def on_train_end(self, ctx: TrainContext) -> None:
        self._report(ctx, {**ctx.last_validation, "final": 1.0}, checkpoint=True, final=True)


class PackCheckpoint:
    """A pack's Ray Train checkpoint: finished members' models, running ones' training
    snapshots and ``pack.json``, from which a restarted worker resumes exactly."""

    def __init__(self) -> None:
        self.staging = Path(tempfile.mkdtemp(prefix="optw-pack-"))  # finished members' files
        self.done: list[str] = []
        self.running: dict[str, TrainContext] = {}  # in start order

    def restore(self, folder: Path) -> dict[str, dict]:
        """Keep a checkpoint's finished models; returns the running members' snapshots."""
        from optw.model import read_checkpoint

        state = json.loads((folder / PACK_FILE).read_text())
        for key in state["done"]:
            shutil.copyfile(folder / f"{key}.pt", self.staging / f"{key}.pt")
        self.done = list(state["done"])
        running = {key: folder / f"last-{key}.pt" for key in state["running"]}
        return {key: read_checkpoint(path) for key, path in running.items() if path.exists()}

    def finish(self, key: str, snapshot: dict) -> None:
        write_checkpoint(snapshot, self.staging / f"{key}.pt")
        self.running.pop(key, None)
        if key not in self.done:
            self.done.append(key)

    def write(self, folder: Path) -> None:
        """The finished members' models and every running member's snapshot into ``folder``."""
        for key in self.done:
            shutil.copyfile(self.staging / f"{key}.pt", folder / f"{key}.pt")
        for key, ctx in self.running.items():
            write_checkpoint(ctx.snapshot(), folder / f"last-{key}.pt")
        (folder / PACK_FILE).write_text(json.dumps({"done": self.done,
                                                    "running": list(self.running)}))


def restart_notice(name: str, max_failures: int):
    """A Ray Train callback printing one warning line when a worker of run ``name`` fails."""
    from ray.train import UserCallback

    class RestartNotice(UserCallback):
        def __init__(self) -> None:
            self.failures = 0

        def __reduce__(self):  # the class is made here: pickle the factory's call
            return restart_notice, (name, max_failures)

        def after_exception(self, run_context: Any,
                            worker_exceptions: dict[int, Exception]) -> None:
            self.failures += 1
            error = next(iter(worker_exceptions.values()), None)
            what = (str(error).strip().splitlines() or [""])[0][:300]
            then = (f"Ray Train restarts it from its last checkpoint (restart {self.failures} "
                    f"of {max_failures})" if self.failures <= max_failures
                    else "no restarts left: the run fails")
            print(f"warning: a worker of {name} failed ({type(error).__name__}: {what}); "
                  f"{then}", file=sys.stderr, flush=True)

    return RestartNotice()


@dataclass(frozen=True)
class WorkerSpec:
    """What a Ray Train worker needs to train one model."""

    config: TrainConfig
    key: str  # region id, or global-<group> / transfer-<group>, or the Tune regions
    stage: str  # scratch | global | finetune | tune
    catalog: str  # a folder or a URI (the worker mirrors a URI on its node)
    tracking_uri: str
    run_id: str | None  # the MLflow child run the worker logs to (None: Tune sets it per trial)
    init: str | None = None  # a model file to start from (fine-tuning): a path or a URI
    ils_means: Mapping[str, float] = field(default_factory=dict)
    callbacks: tuple[Callback, ...] = ()  # picklable, added to the worker's own
    demos: Mapping[str, Demonstrations] | None = None  # its regions', if config.demos

    @classmethod
    def build(cls, config: TrainConfig, key: str, stage: str, *, catalog: str,
              tracking_uri: str, run_id: str | None, init: str | None = None,
              callbacks: Sequence[Callback] = (),
              demos: Mapping[str, Demonstrations] | None = None) -> WorkerSpec:
        """The spec of a model trained with ``config`` (ILS means from ``catalog``)."""
        means = ils_validation_means(local_catalog(catalog), config.regions,
                                     config.val_tourists)
        return cls(config, key, stage, st.normalize(catalog), tracking_uri, run_id, init, means,
                   callbacks=tuple(callbacks), demos=demos)


@dataclass(frozen=True)
class WorkerPack:
    """What one Ray Train worker trains: its specs, side by side (``batched``) or in turn."""

    specs: tuple[WorkerSpec, ...]
    batched: bool = False


def train_worker(pack: WorkerPack, error_file: str) -> None:
    """The Ray Train worker: trains the pack on local files; an OptwError ends it normally
    with its message in ``error_file`` (a location), so that Ray Train does not restart it."""
    try:
        with contextlib.ExitStack() as stack:
            local = functools.cache(local_catalog)  # each catalog mirrored once
            release = functools.cache(lambda g: checked_release(g)[0])  # checked once
            specs = []
            for spec in pack.specs:
                init = (None if not spec.init else release(spec.init[len(RELEASE_PREFIX):])
                        if spec.init.startswith(RELEASE_PREFIX)  # this node's copy, checked
                        else stack.enter_context(st.local_file(spec.init)))
                specs.append(replace(spec, catalog=local(spec.catalog), init=init and str(init)))
            _train_local(specs, pack.batched)
    except OptwError as exc:
        st.write_bytes(error_file, str(exc).encode())


def _train_local(specs: list[WorkerSpec], batched: bool) -> None:
    """:func:`train_worker` once every spec names local files."""
    import ray.train
    import torch

    from optw.catalog import open_catalog
    from optw.tracking import MlflowCallback
    from optw.train import train
    from optw.train.pack import train_pack

    started = time.time()
    quiet_train_worker()
    pack = PackCheckpoint()
    resume: dict[str, dict] = {}
    if (checkpoint := ray.train.get_checkpoint()) is not None:  # restarted, or a crashed job re-run
        with checkpoint.as_directory() as folder:
            resume = pack.restore(Path(folder))

    def callbacks(member: int, spec: WorkerSpec) -> list[Callback]:
        return [RayReport(REPORT_EVERY, spec.config.checkpoint_every,
                          {"region": spec.key, "stage": spec.stage}, spec.ils_means, pack,
                          {"member": member, "worker_started_at": started}),
                MlflowCallback(spec.run_id, uri=spec.tracking_uri, log_every=LOG_EVERY,
                               log_checkpoint=False), *spec.callbacks]

    todo = [(m, s) for m, s in enumerate(specs) if s.key not in pack.done]
    if batched and len(todo) > 1:  # a restarted worker with one member left trains it alone
        train_pack([s.config for _, s in todo], open_catalog(todo[0][1].catalog),
                   [callbacks(m, s) for m, s in todo], [s.init for _, s in todo],
                   [resume.get(s.key) for _, s in todo])
        return
    for member, spec in todo:
        if spec.config.threads:
            torch.set_num_threads(spec.config.threads)
        train(spec.config, open_catalog(spec.catalog), callbacks(member, spec), init=spec.init,
              resume=resume.get(spec.key), demos=spec.demos)


def error_location(storage: str, name: str) -> str:
    return st.join(storage, f".{name}.optw-error")


def make_trainer(pack: WorkerPack | WorkerSpec, storage: str, name: str,
                 resources: ResourcesSection, use_gpu: bool, max_failures: int | None = None,
                 callbacks: list | None = None,
                 worker_resources: Mapping[str, float] | None = None):
    """A TorchTrainer whose one worker runs :func:`train_worker` on a pack (or one spec)."""
    from ray.train import FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    pack = WorkerPack((pack,)) if isinstance(pack, WorkerSpec) else pack
    per_worker = worker_need(resources, use_gpu, worker_resources)
    failures = resources.max_failures if max_failures is None else max_failures
    storage_path, storage_fs = st.ray_storage(storage)
    run_config = RunConfig(
        name=name, storage_path=storage_path, storage_filesystem=storage_fs,
        callbacks=[*(callbacks or []), restart_notice(name, failures)],
        failure_config=FailureConfig(max_failures=failures, controller_failure_limit=2),
        logging_config=LoggingConfig(log_level=train_log_level()))
    scaling = ScalingConfig(num_workers=1, use_gpu=use_gpu, resources_per_worker=per_worker)
    return TorchTrainer(functools.partial(train_worker, pack, error_location(storage, name)),
                        scaling_config=scaling, run_config=run_config)


def fit_checked(trainer: Any, storage: str, name: str) -> Any:
    """``trainer.fit()``: its result, or the :class:`WorkerError` its worker left."""
    location = error_location(storage, name)
    st.delete(location)  # an earlier run's
    result = trainer.fit()
    if st.exists(location):
        message = st.read_bytes(location).decode(errors="replace")
        st.delete(location)
        raise WorkerError(message)
    return result


def fit_pack(pack: WorkerPack, storage: str, name: str, resources: ResourcesSection,
             use_gpu: bool, outs: Mapping[str, str],
             worker_resources: Mapping[str, float] | None = None) -> tuple[float, float]:
    """Train a pack, copy its final models to ``outs``; returns startup and training seconds.
    The same ``name`` and ``storage`` resume from the run's last checkpoint."""
    t0 = time.time()
    result = fit_checked(make_trainer(pack, storage, name, resources, use_gpu,
                                      worker_resources=worker_resources), storage, name)
    t1 = time.time()
    if result.checkpoint is None:
        raise RuntimeError(f"{name}: training finished without a checkpoint")
    with result.checkpoint.as_directory() as folder:  # a download, for remote storage
        for spec in pack.specs:
            src = Path(folder) / f"{spec.key}.pt"
            if not src.exists():
                raise RuntimeError(f"{name}: no final model of {spec.key} in the checkpoint")
            st.put_file(src, outs[spec.key])
    started = float((result.metrics or {}).get("worker_started_at", t0))
    started = min(max(started, t0), t1)
    return started - t0, t1 - started
