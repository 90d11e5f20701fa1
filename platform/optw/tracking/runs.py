"""Experiments and runs: one experiment per job, a parent run per job, a child per (stage, region),
addressed by ``run_id`` (never fluent ``mlflow`` state), so Ray workers log to them."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import subprocess
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePath
from typing import Any

from optw.catalog import CATALOG_VERSION
from optw.paths import PROJECT_ROOT
from optw.tracking.uri import artifact_root, check_tracking_uri, get_client

log = logging.getLogger(__name__)

PARENT_TAG = "mlflow.parentRunId"
MAX_PARAM_VALUE = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
MAX_PER_BATCH = 100  # params or tags per log_batch call
_BAD_KEY = re.compile(r"[^\w\-. /]")


def _plain(value: Any) -> Any:
    """JSON-friendly copy: dataclasses/mappings -> dict, sequences -> list, paths -> str."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_plain(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, PurePath):
        return value.as_posix()
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return value.item()  # numpy / torch scalars
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def config_dict(config: Any) -> dict[str, Any]:
    """A config (a mapping or a dataclass) as a plain nested dict."""
    if config is None:
        return {}
    if not isinstance(plain := _plain(config), dict):
        raise TypeError(f"config must be a mapping or a dataclass, not {type(config).__name__}")
    return plain


def flatten_config(config: Any) -> dict[str, str]:
    """Nested config -> ``{"model.hidden": "128", ...}``; lists become JSON strings."""
    def walk(prefix: str, value: Any) -> Iterator[tuple[str, str]]:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                yield from walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, (list, dict)):
            yield prefix, json.dumps(value, sort_keys=True)
        else:
            yield prefix, "None" if value is None else str(value)

    return dict(item for key, value in config_dict(config).items()
                for item in walk(str(key), value))


def config_hash(config: Any) -> str:
    """Stable 16-hex-digit SHA-256 of the config (key order does not matter)."""
    blob = json.dumps(config_dict(config), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def git_commit(root: Path = PROJECT_ROOT) -> str:
    """``$OPTW_GIT_COMMIT``, else ``git rev-parse HEAD`` in the project, else ``'unknown'``."""
    if env := os.environ.get("OPTW_GIT_COMMIT"):
        return env
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = res.stdout.strip()
    return commit if res.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", commit) else "unknown"


def run_params(config: Any, commit: str | None = None) -> dict[str, str]:
    """What every run logs as params: flattened config + git commit + catalog version + hash."""
    params = flatten_config(config)
    params.update(git_commit=commit or git_commit(), catalog_version=str(CATALOG_VERSION),
                  config_hash=config_hash(config))
    return params


def metric_key(key: Any) -> str:
    """A metric/param/tag name MLflow accepts (other characters become ``_``)."""
    return _BAD_KEY.sub("_", str(key))[:250]


def log_params(run_id: str, params: Mapping[str, Any], uri: str | None = None) -> None:
    """Log params in batches; a key already logged keeps its value (a change is a warning)."""
    from mlflow.entities import Param

    client = get_client(uri)
    existing = client.get_run(run_id).data.params
    todo = {}
    for k, v in params.items():
        k, v = metric_key(k), str(v)[:MAX_PARAM_VALUE]
        if k not in existing:
            todo[k] = v
        elif existing[k] != v:
            log.warning("run %s: param %r already logged as %r, keeping it (new value %r)",
                        run_id, k, existing[k], v)
    _log_batches(run_id, "params", [Param(k, v) for k, v in todo.items()], uri)


def set_tags(run_id: str, tags: Mapping[str, Any], uri: str | None = None) -> None:
    from mlflow.entities import RunTag

    items = [RunTag(metric_key(k), str(v)[:8000]) for k, v in tags.items()]
    _log_batches(run_id, "tags", items, uri)


def _log_batches(run_id: str, kind: str, items: list, uri: str | None) -> None:
    for i in range(0, len(items), MAX_PER_BATCH):
        get_client(uri).log_batch(run_id, **{kind: items[i:i + MAX_PER_BATCH]})


def experiment_id(name: str, uri: str | None = None) -> str:
    """Id of experiment ``name``, created or restored if needed (sqlite: ``mlartifacts/<name>``)."""
    from mlflow.exceptions import MlflowException

    client = get_client(uri)
    if (exp := client.get_experiment_by_name(name)) is None:
        root = artifact_root(uri)
        location = None if root is None else (
            root / re.sub(r"[^A-Za-z0-9_.-]+", "_", name)).as_uri()
        try:
            return client.create_experiment(name, artifact_location=location)
        except MlflowException:  # created meanwhile by another process
            if (exp := client.get_experiment_by_name(name)) is None:
                raise
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    return exp.experiment_id


def run_url(uri: str, experiment_id: str, run_id: str) -> str | None:
    """A run's page in the MLflow UI of an http(s) store, else ``None``."""
    return (f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
            if uri.startswith(("http://", "https://")) else None)


@dataclasses.dataclass(frozen=True)
class JobRun:
    """Handle on a job's parent run; picklable, so it can be passed to Ray tasks."""

    run_id: str
    experiment_id: str
    job_name: str
    tracking_uri: str
    git_commit: str
    config_hash: str

    def child(self, stage: str, region: str, config: Any = None,
              tags: Mapping[str, Any] | None = None) -> str:
        return start_child_run(self, stage, region, config, tags)

    @property
    def url(self) -> str | None:
        """The run's page in the MLflow UI when the store is a server (else ``None``)."""
        return run_url(self.tracking_uri, self.experiment_id, self.run_id)

    def finish(self, status: str = "FINISHED") -> None:
        """End the run as ``status``; unless FINISHED, its children still RUNNING end KILLED
        first (a stopped job's models: their workers are gone)."""
        if status != "FINISHED":
            try:
                end_children(self.run_id, "KILLED", self.tracking_uri)
            except Exception as exc:  # noqa: BLE001 - the parent's status matters more
                log.warning("run %s: its running child runs were not ended: %s", self.run_id, exc)
        end_run(self.run_id, status, self.tracking_uri)

    def __enter__(self) -> JobRun:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish("KILLED" if exc_type is KeyboardInterrupt else
                    "FAILED" if exc_type else "FINISHED")


def start_job_run(job_name: str, config: Any, tags: Mapping[str, Any] | None = None, *,
                  uri: str | None = None) -> JobRun:
    """Parent run of a job in experiment ``job_name`` with the config as params (the store is
    checked first); ``with`` ends it FINISHED/FAILED, else ``finish()``."""
    uri = check_tracking_uri(uri)
    commit = git_commit()
    params = run_params(config, commit)
    exp_id = experiment_id(job_name, uri)
    run_tags = {"job": job_name, "mlflow.source.name": job_name,
                "config_hash": params["config_hash"], **(tags or {})}
    if commit != "unknown":
        run_tags["mlflow.source.git.commit"] = commit
    run = get_client(uri).create_run(
        exp_id, run_name=f"{job_name}-{time.strftime('%Y%m%d-%H%M%S')}",
        tags={k: str(v) for k, v in run_tags.items()})
    log_params(run.info.run_id, params, uri)
    return JobRun(run.info.run_id, exp_id, job_name, uri, commit, params["config_hash"])


def find_child_run(parent_run_id: str, stage: str, region: str,
                   uri: str | None = None) -> str | None:
    """Run id of the (stage, region) child of a parent run, if one exists."""
    client = get_client(uri)
    found = client.search_runs(
        [client.get_run(parent_run_id).info.experiment_id],
        filter_string=(f"tags.mlflow.parentRunId = '{parent_run_id}' and tags.stage = '{stage}'"
                       f" and tags.region = '{region}'"),
        order_by=["attributes.start_time ASC"], max_results=1)
    return found[0].info.run_id if found else None


def start_child_run(parent: JobRun, stage: str, region: str, config: Any = None,
                    tags: Mapping[str, Any] | None = None, *, uri: str | None = None) -> str:
    """Child run ``<stage>/<region>`` of ``parent`` with :func:`run_params` of ``config``; an
    existing one is set RUNNING again and returned, so a retried task logs to the same run."""
    uri = uri or parent.tracking_uri
    client = get_client(uri)
    if (run_id := find_child_run(parent.run_id, stage, region, uri)) is not None:
        client.update_run(run_id, status="RUNNING")
    else:
        run_tags = {PARENT_TAG: parent.run_id, "stage": stage, "region": region, **(tags or {}),
                    "job": parent.job_name}
        run_id = client.create_run(parent.experiment_id, run_name=f"{stage}/{region}",
                                   tags={k: str(v) for k, v in run_tags.items()}).info.run_id
    params = run_params(config, parent.git_commit)
    log_params(run_id, params, uri)
    set_tags(run_id, {"config_hash": params["config_hash"]}, uri)
    return run_id


def end_run(run_id: str, status: str = "FINISHED", uri: str | None = None) -> None:
    """Mark a run FINISHED, FAILED or KILLED (from any process)."""
    get_client(uri).set_terminated(run_id, status=status)


def end_children(parent_run_id: str, status: str = "KILLED", uri: str | None = None) -> list[str]:
    """End the child runs of ``parent_run_id`` still RUNNING as ``status``; their ids."""
    client = get_client(uri)
    experiment = client.get_run(parent_run_id).info.experiment_id
    query = f"tags.{PARENT_TAG} = '{parent_run_id}' and attributes.status = 'RUNNING'"
    ids, token = [], None
    while True:
        page = client.search_runs([experiment], query, max_results=1000, page_token=token)
        ids += [run.info.run_id for run in page]
        if not (token := page.token):
            break
    for run_id in ids:
        client.set_terminated(run_id, status=status)
    return ids


def log_demonstrations(run_id: str, demos: Mapping[str, Any], source: str,
                       uri: str | None = None) -> None:
    """Log ``{region: Demonstrations}`` as the run's training input dataset (from ``source``)."""
    import mlflow.data
    import pandas as pd
    from mlflow.entities import DatasetInput, InputTag

    rows = [{"region": rid, "tourist": float(t), "score": float(s), "route": json.dumps(r)}
            for rid, d in demos.items()
            for t, s, r in zip(d.tourists.tourist_id, d.scores, d.routes, strict=True)]
    with warnings.catch_warnings():  # MLflow's notes on schema inference and source kinds
        warnings.simplefilter("ignore")
        dataset = mlflow.data.from_pandas(pd.DataFrame(rows), source=source,
                                          name=f"demonstrations ({len(rows)})")._to_mlflow_entity()
    get_client(uri).log_inputs(run_id, [DatasetInput(
        dataset, tags=[InputTag("mlflow.data.context", "training")])])
