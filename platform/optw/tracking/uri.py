"""The tracking URI (``uri=None``: :func:`tracking_uri`), its fail-fast check and cached clients;
MLflow's process-global URI is never set, so a Ray worker logs to the store the driver named."""

from __future__ import annotations

import functools
import logging
import os
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from optw import paths
from optw.errors import OptwError

if TYPE_CHECKING:
    from mlflow import MlflowClient

ENV_URI = "MLFLOW_TRACKING_URI"
ARTIFACTS_DIR = "mlartifacts"


class TrackingUnavailableError(OptwError, RuntimeError):
    """The tracking store cannot be reached or written (raised before any work starts)."""


def default_tracking_uri() -> str:
    """``sqlite:///<project>/mlflow.db`` (absolute path, so it works from any folder)."""
    return f"sqlite:///{paths.mlflow_db().as_posix()}"


def tracking_uri(uri: str | None = None) -> str:
    """``uri`` if given, else ``$MLFLOW_TRACKING_URI``, else :func:`default_tracking_uri`."""
    return uri or os.environ.get(ENV_URI) or default_tracking_uri()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (``None`` for other schemes or in-memory)."""
    match = re.match(r"^sqlite:///([^?]*)", uri)
    path = match.group(1) if match else ""
    return Path(path) if path and path != ":memory:" else None


def artifact_root(uri: str | None = None) -> Path | None:
    """``mlartifacts`` beside a sqlite store's database; ``None`` for servers."""
    db = sqlite_path(tracking_uri(uri))
    return db.resolve().parent / ARTIFACTS_DIR if db is not None else None


def quiet() -> None:
    """Silence MLflow's chatter that says nothing actionable (DB migrations, progress bars)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # per ended run
    for name in ("alembic", "mlflow.store.db.utils", "mlflow.store.model_registry.abstract_store"):
        logging.getLogger(name).setLevel(logging.WARNING)


#: URI schemes of the stores MLflow opens itself (tracking and model registry alike; a
#: database's may name a driver: ``postgresql+psycopg2://``).
SCHEMES = ("http", "https", "sqlite", "file", "postgresql", "mysql", "mssql", "databricks",
           "databricks-uc", "uc")
ACCEPTED = ("an MLflow server (http://HOST:PORT or https://...), sqlite:///PATH, a folder "
            "(PATH or file:///PATH) or a database (postgresql://, mysql://, mssql://...)")


def check_tracking_uri(uri: str | None = None, timeout: float = 3.0,
                       existing: bool = False, option: str = "--tracking-uri") -> str:
    """The URI, else :class:`TrackingUnavailableError`: a store MLflow opens (an unknown scheme
    is named with ``option``, or ``$MLFLOW_TRACKING_URI`` where it came from there); a server must
    answer within ``timeout``, a sqlite or file store be writable (``existing``: the file exist)."""
    source = option if uri and uri != os.environ.get(ENV_URI) else f"${ENV_URI}"
    uri = tracking_uri(uri)
    scheme = urllib.parse.urlparse(uri).scheme
    _check_scheme(uri, scheme, source)
    if scheme in ("http", "https"):
        _check_http(uri, timeout)
    elif scheme == "sqlite" and (db := sqlite_path(uri)) is not None:
        if existing and not db.exists():
            raise TrackingUnavailableError(
                f"tracking store {uri}: {db} does not exist (nothing was tracked there; "
                f"set {ENV_URI} or --tracking-uri to the store a job wrote)")
        _check_writable(db.parent, uri)
        if db.exists() and not (db.is_file() and os.access(db, os.R_OK | os.W_OK)):
            raise TrackingUnavailableError(
                f"tracking store {uri}: {db} is not a readable and writable file")
    elif scheme in ("", "file"):
        path = Path(urllib.parse.urlparse(uri).path if scheme else uri)
        _check_writable(path if path.exists() else path.parent, uri)
    return uri


def _check_scheme(uri: str, scheme: str, source: str) -> None:
    """A scheme of :data:`SCHEMES`, a path, or one an MLflow plugin adds; else one line naming
    ``source`` and what is accepted."""
    if len(scheme) <= 1 or scheme.lower().split("+", 1)[0] in SCHEMES:
        return  # a path (a Windows drive letter too) or MLflow's own
    from mlflow.tracking.registry import UnsupportedModelRegistryStoreURIException

    try:
        get_client(uri)  # MLflow's registries, plugins included
    except UnsupportedModelRegistryStoreURIException:
        raise TrackingUnavailableError(
            f"{source} {uri}: MLflow has no store for the scheme {scheme!r}; give "
            f"{ACCEPTED}") from None


def check_cluster_tracking(uri: str, nodes: int) -> str:
    """A store every node of a Ray cluster reaches: a sqlite file or file store is refused."""
    scheme = urllib.parse.urlparse(uri).scheme
    kind = {"sqlite": "a sqlite file", "file": "a file store", "": "a file store"}.get(scheme)
    if kind is not None:
        raise TrackingUnavailableError(
            f"tracking store {uri}: {kind} on this node's disk, which the other nodes of the "
            f"{nodes}-node Ray cluster cannot reach; set {ENV_URI} (or --tracking-uri) to an "
            "MLflow server with proxied artifacts, e.g. http://<head>:5000 from "
            "`python -m optw.tracking.server --host 0.0.0.0` (see docs/cluster.md)")
    return uri


def check_artifact_location(uri: str, experiment: str, nodes: int) -> None:
    """On a cluster the artifacts of ``experiment`` must not go to one machine's disk; proxied
    (``mlflow-artifacts:``) and object-store locations pass."""
    if (exp := get_client(uri).get_experiment_by_name(experiment)) is None:
        return
    location = exp.artifact_location or ""
    if urllib.parse.urlparse(location).scheme in ("", "file"):
        raise TrackingUnavailableError(
            f"experiment {experiment!r} at {uri} keeps its artifacts at {location}, a folder "
            f"that Ray workers on the other nodes of the {nodes}-node cluster write to their "
            "own disks; serve artifacts through the server (`python -m optw.tracking.server` "
            "does) and choose a new job name (--name)")


def _check_http(uri: str, timeout: float) -> None:
    """GET ``/health``, else (none behind a proxy) the REST API, where a 4xx means it is up."""
    hint = (f"start it (`make mlflow-server`, see docs/tracking.md) or unset {ENV_URI} to use "
            "the local sqlite store")
    for path in ("/health", "/api/2.0/mlflow/experiments/search?max_results=1"):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + path, timeout=timeout):
                return
        except urllib.error.HTTPError as exc:
            if exc.code >= 500:
                raise TrackingUnavailableError(f"MLflow tracking server {uri} answers "
                                               f"{path} with HTTP {exc.code}") from None
            if path != "/health":
                return
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise TrackingUnavailableError(f"MLflow tracking server {uri} is unreachable "
                                           f"({getattr(exc, 'reason', exc)}); {hint}") from None


def _check_writable(folder: Path, uri: str) -> None:
    if not folder.is_dir():
        raise TrackingUnavailableError(f"tracking store {uri}: folder {folder} does not exist")
    try:
        tempfile.NamedTemporaryFile(dir=folder, prefix=".optw-write-check-").close()  # then deleted
    except OSError as exc:
        raise TrackingUnavailableError(
            f"tracking store {uri}: folder {folder} is not writable ({exc.strerror})") from None


#: MLflow's HTTP limits unless set: a call ends within about a minute, not after minutes of retries.
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "30", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
               "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


def get_client(uri: str | None = None) -> MlflowClient:
    """One cached ``MlflowClient`` per URI and process (tracking and registry on one store)."""
    return _client(tracking_uri(uri))


@functools.lru_cache(maxsize=8)
def _client(uri: str) -> MlflowClient:
    quiet()
    for key, value in HTTP_LIMITS.items():
        os.environ.setdefault(key, value)
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)
