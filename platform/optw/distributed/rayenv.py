"""Ray's settings for the project's clusters, written once, and connecting to a cluster.

:data:`RAY_ENV` (kept in :mod:`optw.raylocal`, which ``optw serve`` uses too) holds the
environment defaults every local Ray the project starts gets (:func:`configure_ray_env` before
``ray.init``; ``jobs/embedded.sh`` exports the same table,
printed by ``python -m optw.distributed.rayenv``, before ``ray start``). A value already in the
environment wins.

:func:`connect` joins the cluster at an address or starts a local one, and refuses in
seconds, with one line naming ``--address``, what would otherwise hang: an address where no
Ray answers, or several Ray instances on this machine to choose from. Once connected, SIGTERM
ends the driver as Ctrl-C does (:func:`optw.raylocal.interrupt_on_signals`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import urllib.parse
from collections.abc import Iterator

from optw.errors import OptwError
from optw.raylocal import RAY_ENV, configure_ray_env

#: What the embedded head (``ray start`` in jobs/embedded.sh) adds: Ray >= 2.59 protects a
#: local cluster with a token; saying so explicitly makes ``ray job submit`` send it too
#: (:func:`optw.raylocal.ensure_token` makes it once).
HEAD_ENV: dict[str, str] = {"RAY_AUTH_MODE": "token"}
#: The job-level runtime environment of every cluster the project connects to: each worker
#: process of the job pins the cluster's address and quiets Ray's transient internals
#: (:func:`optw.raylocal.setup_worker`, in a module that imports nothing heavy: every worker
#: process runs it when it starts).
RUNTIME_ENV: dict[str, str] = {"worker_process_setup_hook": "optw.raylocal.setup_worker"}
__all__ = ["RAY_ENV", "RUNTIME_ENV", "configure_ray_env", "connect", "own_connection"]
#: Seconds an address gets to answer before the job is refused.
CONNECT_TIMEOUT_S = 5.0


class RayAddressError(OptwError, ConnectionError):
    """A Ray address (or the lack of one) that cannot be used; one line naming ``--address``."""


def shell_exports() -> str:
    """``export NAME="${NAME:-value}"`` lines of :data:`RAY_ENV` and :data:`HEAD_ENV`, for a
    shell's ``eval`` before ``ray start``."""
    return "\n".join(f'export {name}="${{{name}:-{value}}}"'
                     for name, value in {**RAY_ENV, **HEAD_ENV}.items())


def _host_port(address: str) -> tuple[str, int] | None:
    """The host and port of ``host:port``, ``ray://host:port`` or ``http://host:port``;
    None for ``auto``, ``local`` and anything without a port."""
    text = address if "://" in address else f"tcp://{address}"
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return parts.hostname, port


def check_address(address: str | None, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """The address ``ray.init`` should get, or :class:`RayAddressError` in seconds.

    - ``host:port`` (or ``ray://``): something must accept a connection there within
      ``timeout`` seconds (Ray itself retries for minutes);
    - no address (and no ``$RAY_ADDRESS``): a new local cluster when no Ray runs here; a Ray
      instance already running on this machine is joined when it is the one ``ray start``
      left (Ray's own choice); several, or one that Ray would not join (it would start a
      second beside it and hang), are refused naming them.
    - ``local`` and ``auto``: as Ray does.
    """
    if address in (None, "") and not os.environ.get("RAY_ADDRESS"):
        return _local_choice()
    if address in (None, "", "local", "auto"):
        return address or None
    where = _host_port(address)
    if where is None:
        raise RayAddressError(f"--address {address!r}: expected HOST:PORT (e.g. "
                              "127.0.0.1:6379), ray://HOST:PORT, auto or local")
    try:
        socket.create_connection(where, timeout=timeout).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise RayAddressError(f"--address {address}: no Ray cluster answers there ({reason}); "
                              "give the address of a running head (`ray status` on it) or "
                              "leave --address out to start a local one") from None
    return address


def _local_choice() -> str | None:
    """No address given: ``local`` (start a local cluster) when none runs here (never the
    stale address a stopped ``ray start`` left, where Ray would wait), the cluster ``ray
    start`` left when it is the only one; :class:`RayAddressError` otherwise."""
    from ray._private import services

    running = sorted(services.find_gcs_addresses())
    if not running:
        return "local"
    try:
        latest = services.find_bootstrap_address(None)
    except Exception:  # noqa: BLE001 - an unreadable record: no cluster chosen by Ray
        latest = None
    if len(running) == 1 and latest in running:
        return latest
    shown = ", ".join(running)
    return_hint = f"--address {running[0]}" if len(running) == 1 else "--address HOST:PORT"
    raise RayAddressError(
        f"--address: {len(running)} Ray instance(s) already run on this machine ({shown}) "
        f"and none was chosen; pass {return_hint} to run on one of them, or --address local "
        "to start a cluster of this job's own beside them")


def connect(address: str | None = None) -> None:
    """``ray.init`` on the checked address (:func:`check_address`); a local cluster gets
    :data:`RAY_ENV` and its token first. Ray's own log lines stay at WARNING, and SIGTERM
    interrupts the driver (no stack dump of Ray's)."""
    import ray

    from optw.raylocal import ensure_token, interrupt_on_signals
    from optw.raylogs import quiet_ray_loggers

    address = check_address(address)
    configure_ray_env()
    if address in (None, "local"):
        ensure_token()  # a local cluster started with RAY_AUTH_MODE=token needs one
    quiet_ray_loggers()  # e.g. the notice that token authentication is on, printed by init
    ray.init(address=address, configure_logging=True, logging_level="WARNING",
             log_to_driver=True, runtime_env=RUNTIME_ENV)
    quiet_ray_loggers()  # the handlers init made drop Ray's noise too
    interrupt_on_signals()


@contextlib.contextmanager
def own_connection() -> Iterator[None]:
    """For a command's block: a Ray connection the block makes is shut down when it ends, so
    that Ray's last lines (a stopped Tune trial's placement-group clean-up, the shutdown's)
    arrive while the block's output filter (:func:`optw.raylogs.quiet_ray_output`) is on. A
    connection made before the block is left as it is."""
    import ray

    before = ray.is_initialized()
    try:
        yield
    finally:
        if not before and ray.is_initialized():
            ray.shutdown()


def warm_train_coordinator() -> None:
    """Start Ray Train's autoscaling coordinator now, while the job does other work (ILS).

    Ray Train (>= 2.5x) asks this detached actor for resources when each run starts and waits
    at most 5 s; the first run of a cluster creates it, and on a busy machine its process starts
    slower than that: the run then prints a "Failed to send resource request" traceback and
    waits out the 5 s. Started here, it is up when the first run asks. Best effort (a Ray
    without it, or a private API that moved: nothing happens)."""
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )

        get_or_create_autoscaling_coordinator()  # asynchronous: the actor starts meanwhile
    except Exception:  # noqa: BLE001 - an optimisation only
        pass


def main() -> int:
    """``python -m optw.distributed.rayenv``: print the export lines (for ``eval``)."""
    print(shell_exports())
    return 0


if __name__ == "__main__":
    sys.exit(main())
