"""Experiment tracking and model registry (MLflow; ``docs/tracking.md``): the driver makes the
runs, workers log to them by ``run_id`` and register their models."""

from optw.tracking.callback import MlflowCallback, log_file
from optw.tracking.evaluation import log_evaluation, log_tables
from optw.tracking.registry import (
    CHAMPION,
    RegionSolver,
    VersionInfo,
    champion,
    find_champion_with,
    load_solver,
    model_name,
    register_release,
    register_version,
    release_model_name,
    set_champion,
    versions_for_run,
)
from optw.tracking.runs import (
    JobRun,
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
    "check_cluster_tracking", "check_tracking_uri", "config_hash", "end_run", "experiment_id",
    "find_champion_with", "find_child_run", "flatten_config", "get_client", "git_commit",
    "load_solver", "local_server", "log_demonstrations", "log_evaluation", "log_file",
    "log_params", "log_tables", "model_name", "register_release", "register_version",
    "release_model_name", "run_params", "server_command",
    "set_champion", "set_tags", "start_child_run", "start_job_run", "tracking_uri",
    "versions_for_run",
]
