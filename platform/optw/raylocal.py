"""Ray's token and environment for the project's local clusters, and the set-up of their drivers
and workers (light: every Ray worker imports it); an entry point that may start a local cluster
calls :func:`ensure_token` first (``python -m optw.raylocal``)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from optw.paths import path_error

TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"

#: Environment defaults of the project's Ray clusters (inherited by a local cluster).
RAY_ENV: dict[str, str] = {
    # a worker importing torch on a busy machine can miss Ray Train's default 60 s to join
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "600",
    # the controller takes one report off a worker's queue per poll (every 2 s by default)
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    # one actor process less per run; it only matters on preemptible nodes
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    # Serve's controller kills an HTTP proxy not ready in 5 s by default
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
    # at Ray's default nice 15 the workers get a few % of a core beside any busy process
    "RAY_worker_niceness": "0",
}


def configure_ray_env() -> None:
    """Set :data:`RAY_ENV`'s defaults in this process (call before a local ``ray.init``)."""
    for name, value in RAY_ENV.items():
        os.environ.setdefault(name, value)


def default_token_path() -> Path:
    """Where Ray looks for the token when no variable names one (``~/.ray/auth_token``)."""
    return Path.home() / ".ray" / "auth_token"


def _token_path() -> Path:
    """The file Ray reads the token from: ``$RAY_AUTH_TOKEN_PATH``, else the default."""
    named = os.environ.get(TOKEN_PATH_ENV, "").strip()
    return Path(named).expanduser() if named else default_token_path()


def token_source() -> str | None:
    """Where Ray would read the token from now (a variable's name or a file), else None."""
    if os.environ.get(TOKEN_ENV, "").strip():
        return f"${TOKEN_ENV}"
    path = _token_path()
    return str(path) if _has_token(path) else None


def _has_token(path: Path) -> bool:
    try:
        return bool(path.read_text().strip())
    except OSError:
        return False


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure_token(say: Callable[[str], None] | None = _stderr) -> str | None:
    """Make sure a local cluster finds a token (else one is written, mode 0600, ``say`` told
    where); returns where it is (None when ``RAY_AUTH_MODE=disabled``)."""
    if os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "disabled":
        return None
    if source := token_source():
        return source
    path = _token_path()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        if _has_token(path):  # another process made one meanwhile: keep theirs
            return str(path)
        os.replace(tmp, path)
    except OSError as exc:
        raise path_error(exc, path) from None
    finally:
        tmp.unlink(missing_ok=True)
    if say is not None:
        say(f"created the token of local Ray clusters in {path} (`ray get-auth-token` prints "
            f"it; the Ray dashboard asks for it once per browser)")
    return str(path)


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook``: ``RAY_ADDRESS`` and quiet internals."""
    from optw.raylogs import quiet_ray_internals

    with contextlib.suppress(Exception):  # best effort: Ray's own guess stays
        import ray

        os.environ.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    quiet_ray_internals()


def interrupt_on_signals(signals: Iterable[int] = (signal.SIGTERM,)) -> None:
    """In a driver's main thread: ``signals`` raise KeyboardInterrupt, not Ray's stack dump."""
    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    for sig in signals:
        signal.signal(sig, interrupt)


def main() -> int:
    """``python -m optw.raylocal``: ensure the token (a line on stderr when one is created)."""
    try:
        ensure_token()
    except OSError as e:
        print(f"could not write Ray's token: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
