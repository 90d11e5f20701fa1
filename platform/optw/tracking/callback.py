"""``MlflowCallback``: training metrics, validation results and final files into an MLflow run.
A tracking failure is a warning, retried at the next flush, not the end of a training run."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from optw.tracking.runs import config_dict, metric_key
from optw.tracking.uri import get_client, tracking_uri
from optw.train.callbacks import Callback, TrainContext

log = logging.getLogger(__name__)

MAX_METRICS_PER_BATCH = 1000  # mlflow.utils.validation.MAX_METRICS_PER_BATCH
#: Most metric points kept while the store fails (the newest).
MAX_BUFFER = 20_000


class MlflowCallback(Callback):
    """Log training into the run ``run_id`` (what and when: docs/tracking.md); picklable, for
    Ray workers. ``strict`` raises tracking errors instead of warning."""

    def __init__(self, run_id: str, *, uri: str | None = None, log_every: int = 10,
                 flush_every: int = 200, flush_seconds: float = 60.0,
                 log_checkpoint: bool = True, strict: bool = False):
        if log_every < 1 or flush_every < 1:
            raise ValueError("log_every and flush_every must be >= 1")
        self.run_id = run_id
        self.uri = tracking_uri(uri)
        self.log_every = log_every
        self.flush_every = flush_every
        self.flush_seconds = flush_seconds
        self.log_checkpoint = log_checkpoint
        self.strict = strict
        self._buffer: list = []
        self._last_flush = time.monotonic()
        self._last_epoch: tuple[int, dict[str, float]] | None = None
        self._logged_epoch = -1
        self._failures = 0
        self._retry_at = 0.0

    def _add(self, metrics: dict[str, Any], step: int) -> None:
        """Buffer the finite numeric values (numpy / torch scalars too) of ``metrics``."""
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        for key, value in metrics.items():
            try:
                value = float(value)
            except (TypeError, ValueError):
                continue
            if not math.isinf(value):
                self._buffer.append(Metric(metric_key(key), value, ts, step))
        del self._buffer[:-MAX_BUFFER]

    def flush(self, force: bool = False) -> bool:
        """Send buffered points; True if none is left (a failure delays retries unless force)."""
        now = time.monotonic()
        self._last_flush = now
        if not self._buffer:
            return True
        if not force and now < self._retry_at:
            return False
        client = get_client(self.uri)
        try:
            while self._buffer:
                batch = self._buffer[:MAX_METRICS_PER_BATCH]
                client.log_batch(self.run_id, metrics=batch)
                del self._buffer[: len(batch)]
        except Exception as exc:
            self._retry_at = time.monotonic() + max(self.flush_seconds, 30.0)
            self._failed("log metrics", exc)
            return False
        return True

    def _failed(self, what: str, exc: Exception) -> None:
        if self.strict:
            raise exc
        self._failures += 1
        if self._failures <= 3 or self._failures % 100 == 0:
            log.warning("MlflowCallback: could not %s for run %s (%s: %s); %d points buffered",
                        what, self.run_id, type(exc).__name__, exc, len(self._buffer))

    def on_epoch_end(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        epoch = int(ctx.epoch)
        self._last_epoch = (epoch, dict(metrics))
        last = bool(ctx.total_epochs) and epoch >= ctx.total_epochs
        if epoch % self.log_every == 0 or epoch <= 1 or last:
            self._add(metrics, epoch)
            self._logged_epoch = epoch
        if (len(self._buffer) >= self.flush_every
                or time.monotonic() - self._last_flush >= self.flush_seconds):
            self.flush()

    def on_validation(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        self._add(metrics, int(ctx.epoch))
        self.flush()

    def on_train_end(self, ctx: TrainContext) -> None:
        if self._last_epoch is not None and self._last_epoch[0] != self._logged_epoch:
            epoch, metrics = self._last_epoch
            self._add(metrics, epoch)
        if ctx.best_validation is not None:
            self._add({"best_val_score": ctx.best_validation}, int(ctx.epoch))
        self.flush(force=True)
        client = get_client(self.uri)
        try:
            client.set_tag(self.run_id, "epochs_completed", str(int(ctx.epoch)))
            if ctx.config is not None:
                text = json.dumps(config_dict(ctx.config), indent=2, sort_keys=True)
                client.log_text(self.run_id, text, "config.json")
            if self.log_checkpoint and ctx.last_checkpoint is not None:
                if (checkpoint := Path(ctx.last_checkpoint)).is_file():
                    client.log_artifact(self.run_id, str(checkpoint), "checkpoints")
                else:
                    log.warning("MlflowCallback: final checkpoint %s not found", checkpoint)
        except Exception as exc:
            self._failed("log final artifacts", exc)


def log_file(run_id: str, path: str | Path, artifact_path: str | None = None,
             uri: str | None = None) -> None:
    """Log one file as an artifact of ``run_id`` (any process)."""
    get_client(uri).log_artifact(run_id, str(path), artifact_path)
