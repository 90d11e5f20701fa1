"""Experiment tracking and model registry (MLflow). Data flows into it, never back.

Typical job (driver creates runs, workers log by ``run_id``)::

    from optw.tracking import start_job_run, MlflowCallback, register_version, log_evaluation

    with start_job_run("train_all", job_config, tags={"profile": "full"}) as job:  # fails fast
        run_id = job.child("train", "c101", region_config)      # child run, params logged
        # in a Ray task: train(..., callbacks=[MlflowCallback(run_id, uri=job.tracking_uri)])
        version = register_version("c101", ckpt, run_id, tags={...}, uri=job.tracking_uri)

Store: :func:`tracking_uri` (``$MLFLOW_TRACKING_URI`` or ``sqlite:///<project>/mlflow.db``).
``mlflow`` itself is imported only when a function needs it. See ``docs/tracking.md``.
"""

from optw.tracking.callback import MlflowCallback, log_file
from optw.tracking.evaluation import evaluation_metrics, log_evaluation, log_tables, to_markdown
from optw.tracking.registry import (
    CHAMPION,
    RegionSolver,
    VersionInfo,
    champion,
    find_champion_with,
    load_solver,
    model_name,
    register_version,
    set_champion,
    versions_for_run,
)
from optw.tracking.runs import (
    JobRun,
    config_dict,
    config_hash,
    end_run,
    experiment_id,
    find_child_run,
    flatten_config,
    git_commit,
    log_demonstrations,
    log_params,
    run_params,
    set_tags,
    start_child_run,
    start_job_run,
)
from optw.tracking.uri import (
    TrackingUnavailableError,
    artifact_root,
    check_artifact_location,
    check_cluster_tracking,
    check_tracking_uri,
    default_tracking_uri,
    get_client,
    tracking_uri,
)


def __getattr__(name: str):
    # Lazy, so that `python -m optw.tracking.server` does not import its own module twice.
    if name in ("local_server", "server_command"):
        from optw.tracking import server

        return getattr(server, name)
    raise AttributeError(f"module 'optw.tracking' has no attribute {name!r}")


__all__ = [
    "CHAMPION", "JobRun", "MlflowCallback", "RegionSolver", "TrackingUnavailableError",
    "VersionInfo", "artifact_root", "champion", "check_artifact_location",
    "check_cluster_tracking", "check_tracking_uri", "config_dict",
    "config_hash", "default_tracking_uri", "end_run", "evaluation_metrics", "experiment_id",
    "find_champion_with", "find_child_run", "flatten_config", "get_client", "git_commit",
    "load_solver", "local_server", "log_demonstrations", "log_evaluation", "log_file",
    "log_params", "log_tables", "model_name", "register_version", "run_params", "server_command",
    "set_champion", "set_tags", "start_child_run", "start_job_run", "to_markdown",
    "tracking_uri", "versions_for_run",
]
