"""Where the project's folders are (each default overridable by an environment variable;
$OPTW_STORAGE may be a URI, docs/cluster.md), and atomic writes of files there."""

from __future__ import annotations

import hashlib
import os
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from optw.errors import OptwError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
#: ``shared/`` beside the project: benchmark files and reference scores (read-only).
SHARED = PROJECT_ROOT.parent / "shared"


def _env(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value) if value else default


def benchmarks_dir() -> Path:
    """The benchmark instance files: ``$OPTW_BENCHMARKS``, else ``../shared/benchmarks/optw``."""
    return _env("OPTW_BENCHMARKS", SHARED / "benchmarks" / "optw")


def catalog_dir() -> Path:
    """The built region catalog: ``$OPTW_CATALOG``, else ``region_catalog/``."""
    return _env("OPTW_CATALOG", PROJECT_ROOT / "region_catalog")


def reference_dir() -> Path:
    """The paper's reference scores: ``$OPTW_REFERENCE``, else ``../shared/reference``."""
    return _env("OPTW_REFERENCE", SHARED / "reference")


def releases_dir() -> Path:
    """The released global models: ``$OPTW_RELEASES``, else the package's
    ``optw/model/releases/`` (docs/releases.md)."""
    return _env("OPTW_RELEASES", Path(__file__).resolve().parent / "model" / "releases")


def runs_dir() -> Path:
    """Run outputs: ``$OPTW_RUNS``, else ``runs/``."""
    return _env("OPTW_RUNS", PROJECT_ROOT / "runs")


def report_dir(job: str) -> Path:
    """A job's HTML report: ``runs/<job>/report``."""
    return runs_dir() / job / "report"


def join_location(base: str, *parts: str) -> str:
    """``base`` (a path or a URI, whose query is kept) with ``parts`` appended to its path."""
    parts = tuple(p.strip("/") for p in parts if p and p.strip("/"))
    if "://" not in base or base.startswith("file://"):
        return os.path.join(base, *parts)
    split = urllib.parse.urlsplit(base)
    return urllib.parse.urlunsplit(split._replace(path="/".join([split.path.rstrip("/"), *parts])))


def storage_root() -> str:
    """Where jobs keep outputs and Ray Train's checkpoints: ``$OPTW_STORAGE``, else ``runs/``."""
    return os.environ.get("OPTW_STORAGE") or str(runs_dir())


def train_storage() -> str:
    """Ray Train storage of the platform jobs: ``<storage root>/ray_train``."""
    return join_location(storage_root(), "ray_train")


def job_output(job: str) -> str:
    """A platform job's outputs (results, models, report): ``<storage root>/<job>``."""
    return join_location(storage_root(), job)


def catalog_location() -> str:
    """``$OPTW_CATALOG`` as given (a folder or a URI), else ``region_catalog/``."""
    return os.environ.get("OPTW_CATALOG") or str(PROJECT_ROOT / "region_catalog")


def cache_dir() -> Path:
    """Node-local copies of catalogs given by URI: ``$OPTW_CACHE``, else ``runs/.cache``."""
    return _env("OPTW_CACHE", runs_dir() / ".cache")


def tune_storage() -> str:
    """Ray Tune storage of the sweeps: ``<storage root>/ray_tune`` (a folder or a URI)."""
    return join_location(storage_root(), "ray_tune")


def train_run_dir(regions: list[str]) -> Path:
    return runs_dir() / "train" / "+".join(regions)


def mlflow_db() -> Path:
    return PROJECT_ROOT / "mlflow.db"


class PathError(OptwError, OSError):
    """A file or folder that cannot be read or written: one line naming it and why."""


def path_error(exc: OSError, path: str | Path, doing: str = "write") -> PathError:
    """``exc`` as a :class:`PathError` naming its file, or ``path`` (for none or a temp file)."""
    named = exc.filename if exc.filename and not Path(str(exc.filename)).name.startswith(
        f".{Path(path).name}.tmp-") else path
    return PathError(f"cannot {doing} {named}: {exc.strerror or exc}")


def replace_atomic(path: str | Path, write: Callable[[Path], object]) -> Path:
    """``write(tmp)`` a file beside ``path``, then rename it over ``path`` (errors: PathError)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OptwError:
        raise
    except OSError as exc:
        raise path_error(exc, path) from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    return replace_atomic(path, lambda tmp: tmp.write_text(text))


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes; a :class:`PathError` naming it when it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise path_error(exc, path, "read") from None
