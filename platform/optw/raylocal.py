"""Ray's token for the local clusters the project starts, their environment, and what their
drivers and worker processes do when they start or are told to stop.

Ray (>= 2.59) protects a cluster with a token when ``RAY_AUTH_MODE=token``: ``ray start --head``
then refuses to start unless a token exists (``RAY_AUTH_TOKEN``, the file named by
``RAY_AUTH_TOKEN_PATH``, or ``~/.ray/auth_token``), and every client (``ray job submit``, the
dashboard in a browser) must present it. :func:`ensure_token` makes one with Ray's own generator
when none exists, keeps it where Ray looks for it (``~/.ray/auth_token``, readable by its owner
only), reuses one that exists and never prints it. ``python -m optw.raylocal`` does the same
from the shell (``jobs/embedded.sh`` runs it before ``ray start``).

:data:`RAY_ENV` holds the environment defaults of the project's local clusters (jobs and `optw
serve`), :func:`setup_worker` their ``worker_process_setup_hook`` and
:func:`interrupt_on_signals` what a driver does on SIGTERM (all here because this module is
light: every Ray worker process imports it). Every entry point that may start a local cluster
calls :func:`ensure_token` first: the embedded job, ``optw job run`` and ``optw tune`` without
an address, ``optw baseline ils``, ``optw serve``, and the test fixtures.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from optw.paths import path_error

AUTH_MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
#: How to print the token (Ray's own command), for the messages.
PRINT_COMMAND = "ray get-auth-token"

#: Environment defaults of the project's Ray clusters (processes of a local cluster inherit
#: them from the process that starts it).
RAY_ENV: dict[str, str] = {
    # a Ray Train worker importing torch on a busy 2-core machine can take more than Ray
    # Train's default 60 s to join its group; a timed-out start can leak its placement group
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "600",
    # Ray Train's controller takes one report off a worker's queue (of one) per poll, every 2 s
    # by default: a worker that reports (metrics, a checkpoint) more often waits for each poll,
    # and a finished run waits for one; tiny runs would spend most of their time so (a poll
    # is one small actor call; a hung one is still only failed after 10 minutes)
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    # Ray Train's preemption watcher (one more actor process per run) only matters on clusters
    # of preemptible nodes
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    # no usage statistics are sent, and Ray says nothing about them
    "RAY_USAGE_STATS_ENABLED": "0",
    # Ray Serve's controller kills an HTTP proxy that is not ready in 5 s (too short on a busy
    # 2-core machine)
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
    # Ray starts its workers at nice 15: beside any other busy process on the machine the
    # training, evaluation and planner workers get a few % of a core; at 0 they share the CPU
    # fairly
    "RAY_worker_niceness": "0",
}


def configure_ray_env() -> None:
    """Set :data:`RAY_ENV`'s defaults in this process (call before a local ``ray.init``)."""
    for name, value in RAY_ENV.items():
        os.environ.setdefault(name, value)


def default_token_path() -> Path:
    """Where Ray looks for the token when no variable names one (``~/.ray/auth_token``)."""
    return Path.home() / ".ray" / "auth_token"


def token_source() -> str | None:
    """Where Ray would read the token from now (a variable's name or a file), None if there
    is none."""
    if os.environ.get(TOKEN_ENV, "").strip():
        return f"${TOKEN_ENV}"
    named = os.environ.get(TOKEN_PATH_ENV, "").strip()
    if named:
        path = Path(named).expanduser()
        return str(path) if _has_token(path) else None
    path = default_token_path()
    return str(path) if _has_token(path) else None


def _has_token(path: Path) -> bool:
    try:
        return bool(path.read_text().strip())
    except OSError:
        return False


def _generate() -> str:
    """A new token from Ray's own generator (a random secret), or from :mod:`secrets` where
    this Ray has none."""
    try:
        from ray._private.authentication.authentication_token_generator import (
            generate_new_authentication_token,
        )

        return generate_new_authentication_token()
    except ImportError:  # pragma: no cover - older or newer Ray layouts
        import secrets

        return secrets.token_hex(32)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure_token(say: Callable[[str], None] | None = _stderr) -> str | None:
    """Make sure a local cluster started now finds a token; returns where it is kept (None
    when ``RAY_AUTH_MODE=disabled`` asks for none).

    A token that exists (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``'s file, or
    ``~/.ray/auth_token``) is reused, never replaced. Otherwise a new one is written to the file
    Ray reads (``RAY_AUTH_TOKEN_PATH`` when set, else ``~/.ray/auth_token``), created atomically
    with mode 0600, and ``say`` is told once where it is and how to print it (the token itself is
    never shown). Raises :class:`~optw.paths.PathError` naming the file when it cannot be
    written.
    """
    if os.environ.get(AUTH_MODE_ENV, "").strip().lower() == "disabled":
        return None
    return token_source() or _new_token(say)


def _new_token(say: Callable[[str], None] | None) -> str:
    """Write a new token where Ray reads it (see :func:`ensure_token`); returns the file."""
    named = os.environ.get(TOKEN_PATH_ENV, "").strip()
    path = Path(named).expanduser() if named else default_token_path()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(_generate())
        if _has_token(path):  # another process made one meanwhile: keep theirs
            tmp.unlink()
            return str(path)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise path_error(exc, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if say is not None:
        say(f"created the token of local Ray clusters in {path} (`{PRINT_COMMAND}` prints it; "
            f"the Ray dashboard asks for it once per browser)")
    return str(path)


def pin_address() -> None:
    """In each worker process of the job (through :func:`setup_worker`): ``RAY_ADDRESS``
    becomes this cluster's address, so that Ray's own look-ups of "the" cluster inside the job
    (Ray Train's placement-group cleaner asks the State API with no address) find it even
    when other Ray instances run on the machine; without it they fail with "Found multiple
    active Ray instances" and the run waits forever for its resources.

    It lives here because this module imports nothing heavy: every worker process (Ray Train's
    controller and workers, ILS and evaluation tasks, Ray's own detached actors) runs it at
    start, and importing torch there (through ``optw.distributed``) costs 2-4 s of CPU per
    process, enough on a busy 2-core machine for Ray Train's autoscaling coordinator to miss
    its 5 s deadline."""
    try:
        import ray

        os.environ.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    except Exception:  # noqa: BLE001 - best effort: Ray's own guess stays
        pass


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook`` of the project's clusters
    (``optw.distributed.rayenv.RUNTIME_ENV``): :func:`pin_address`, and
    :func:`optw.raylogs.quiet_ray_internals` (Ray Train's transient time-outs stay off the
    console)."""
    from optw.raylogs import quiet_ray_internals

    pin_address()
    quiet_ray_internals()


def interrupt_on_signals(signals: Iterable[int] = (signal.SIGTERM,)) -> None:
    """In a driver, once Ray is initialised: each of ``signals`` ends the process as Ctrl-C
    does (a ``KeyboardInterrupt``: the command's clean-up runs, ``optw`` exits 130). It
    replaces the handler Ray's C++ core installs for SIGTERM, which prints a stack dump
    (``logging.cc: @ 0x... (unknown)`` lines) before the process dies. Only the main thread
    can set handlers: elsewhere nothing changes."""
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
