"""A local MLflow tracking server over the project's store (one worker, proxied artifacts):
``python -m optw.tracking.server [--host H] [--port P]`` (``make mlflow-server``)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from optw.tracking.uri import (
    ARTIFACTS_DIR,
    TrackingUnavailableError,
    artifact_root,
    check_tracking_uri,
    default_tracking_uri,
)


def server_command(host: str = "127.0.0.1", port: int = 5000, *,
                   backend_store_uri: str | None = None,
                   artifacts_destination: str | Path | None = None) -> list[str]:
    """The ``mlflow server`` command (one worker, proxied artifacts) over the project's store."""
    backend = backend_store_uri or default_tracking_uri()
    dest = Path(artifacts_destination) if artifacts_destination else \
        (artifact_root(backend) or Path.cwd() / ARTIFACTS_DIR)
    # the GenAI job runner of MLflow 3 servers is not needed for tracking and the registry
    return ["env", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false",
            sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend,
            "--host", host, "--port", str(port), "--workers", "1",
            "--serve-artifacts", "--default-artifact-root", "mlflow-artifacts:/",
            "--artifacts-destination", dest.resolve().as_uri()]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_server(uri: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Poll ``uri`` until it answers, else TrackingUnavailableError (``timeout``, ``proc`` exit)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            check_tracking_uri(uri, timeout=2.0)
            return
        except TrackingUnavailableError:
            if proc is not None and proc.poll() is not None:
                raise TrackingUnavailableError(
                    f"mlflow server exited with code {proc.returncode} before serving {uri}"
                ) from None
            if time.monotonic() > deadline:
                raise TrackingUnavailableError(
                    f"mlflow server at {uri} not up after {timeout:.0f} s") from None
            time.sleep(0.5)


def stop_server(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the server's process group, SIGKILL after ``timeout`` s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@contextlib.contextmanager
def local_server(port: int | None = None, *, host: str = "127.0.0.1",
                 backend_store_uri: str | None = None,
                 artifacts_destination: str | Path | None = None, startup_timeout: float = 90.0,
                 log_file: str | Path | None = None) -> Iterator[str]:
    """Run a server for the duration of the block and yield its URI (``http://host:port``)."""
    port = port or free_port(host)
    cmd = server_command(host, port, backend_store_uri=backend_store_uri,
                         artifacts_destination=artifacts_destination)
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    uri = f"http://{host}:{port}"
    try:
        wait_for_server(uri, startup_timeout, proc)
        yield uri
    finally:
        stop_server(proc)
        if log_file:
            out.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m optw.tracking.server",
                                     description="Run the project's MLflow tracking server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--backend-store-uri", default=None)
    parser.add_argument("--artifacts-destination", default=None)
    parser.add_argument("--dry-run", action="store_true", help="print the command only")
    args = parser.parse_args(argv)
    cmd = server_command(args.host, args.port, backend_store_uri=args.backend_store_uri,
                         artifacts_destination=args.artifacts_destination)
    if args.dry_run:
        print(" ".join(cmd))
        return
    print(f"MLflow server on http://{args.host}:{args.port}  "
          f"(export MLFLOW_TRACKING_URI=http://{args.host}:{args.port})", flush=True)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
