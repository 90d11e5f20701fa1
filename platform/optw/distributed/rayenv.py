"""Connecting to a Ray cluster; ``python -m optw.distributed.rayenv`` prints Ray's settings
as shell exports for ``jobs/embedded.sh``."""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.parse
from collections.abc import Iterator

from optw.errors import OptwError
from optw.raylocal import RAY_ENV, configure_ray_env

HEAD_ENV: dict[str, str] = {"RAY_AUTH_MODE": "token"}  # explicit: `ray job submit` sends it
#: The job-level runtime environment: each worker process runs :func:`optw.raylocal.setup_worker`.
RUNTIME_ENV: dict[str, str] = {"worker_process_setup_hook": "optw.raylocal.setup_worker"}
CONNECT_TIMEOUT_S = 5.0  # seconds an address gets to answer before the job is refused


class RayAddressError(OptwError, ConnectionError):
    """A Ray address (or the lack of one) that cannot be used; one line naming ``--address``."""


def check_address(address: str | None) -> str | None:
    """The address ``ray.init`` should get, or :class:`RayAddressError` where Ray would hang."""
    if address in (None, "") and not os.environ.get("RAY_ADDRESS"):
        return _local_choice()
    if address in (None, "", "local", "auto"):
        return address or None
    try:  # host:port or scheme://host:port
        parts = urllib.parse.urlsplit(address if "://" in address else f"tcp://{address}")
        where = (parts.hostname, parts.port)
    except ValueError:
        where = (None, None)
    if not where[0] or where[1] is None:
        raise RayAddressError(f"--address {address!r}: expected HOST:PORT (e.g. "
                              "127.0.0.1:6379), ray://HOST:PORT, auto or local")
    try:
        socket.create_connection(where, timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise RayAddressError(f"--address {address}: no Ray cluster answers there ({reason}); "
                              "give the address of a running head (`ray status` on it) or "
                              "leave --address out to start a local one") from None
    return address


def _local_choice() -> str | None:
    """No address: ``local``, or the one ``ray start`` left when it is the only Ray here."""
    from ray._private import services

    running = sorted(services.find_gcs_addresses())
    if not running:
        return "local"
    latest = None  # an unreadable record: no cluster chosen by Ray
    with contextlib.suppress(Exception):
        latest = services.find_bootstrap_address(None)
    if len(running) == 1 and latest in running:
        return latest
    hint = f"--address {running[0]}" if len(running) == 1 else "--address HOST:PORT"
    raise RayAddressError(
        f"--address: {len(running)} Ray instance(s) already run on this machine "
        f"({', '.join(running)}) and none was chosen; pass {hint} to run on one of them, or "
        "--address local to start a cluster of this job's own beside them")


def connect(address: str | None = None) -> None:
    """``ray.init`` on the checked address; SIGTERM then interrupts the driver as Ctrl-C does."""
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
    """Shut down a Ray connection the block makes."""
    import ray

    before = ray.is_initialized()
    try:
        yield
    finally:
        if not before and ray.is_initialized():
            ray.shutdown()


def warm_train_coordinator() -> None:
    """Start Ray Train's autoscaling coordinator early (a slow start costs a run 5 s)."""
    with contextlib.suppress(Exception):  # an optimisation only
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )

        get_or_create_autoscaling_coordinator()  # asynchronous: the actor starts meanwhile


if __name__ == "__main__":  # ``export NAME="${NAME:-value}"`` lines, for a shell's eval
    print("\n".join(f'export {name}="${{{name}:-{value}}}"'
                    for name, value in {**RAY_ENV, **HEAD_ENV}.items()))
