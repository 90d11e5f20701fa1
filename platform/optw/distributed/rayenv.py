"""Ray's settings for the project's clusters, and connecting to a cluster.

``python -m optw.distributed.rayenv`` prints :data:`RAY_ENV`'s defaults as shell exports for
``jobs/embedded.sh`` before ``ray start``. :func:`connect` refuses in seconds, naming
``--address``, what would otherwise hang: an address where no Ray answers, or several local
Ray instances to choose from.
"""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.parse
from collections.abc import Iterator

from optw.errors import OptwError
from optw.raylocal import RAY_ENV, configure_ray_env

#: What the embedded head adds: token authentication, said explicitly so that ``ray job
#: submit`` sends the token too.
HEAD_ENV: dict[str, str] = {"RAY_AUTH_MODE": "token"}
#: The job-level runtime environment: each worker process runs :func:`optw.raylocal.setup_worker`.
RUNTIME_ENV: dict[str, str] = {"worker_process_setup_hook": "optw.raylocal.setup_worker"}
CONNECT_TIMEOUT_S = 5.0  # seconds an address gets to answer before the job is refused


class RayAddressError(OptwError, ConnectionError):
    """A Ray address (or the lack of one) that cannot be used; one line naming ``--address``."""


def check_address(address: str | None) -> str | None:
    """The address ``ray.init`` should get, or :class:`RayAddressError` in seconds: at
    ``host:port`` something must answer within :data:`CONNECT_TIMEOUT_S` (Ray retries for
    minutes); no address: :func:`_local_choice`; ``local`` and ``auto`` as Ray does."""
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
    """No address: ``local`` when no Ray runs here (not the stale address a stopped ``ray
    start`` left), the one ``ray start`` left when it is the only one; else an error (Ray
    would start a second beside it and hang)."""
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
    hint = f"--address {running[0]}" if len(running) == 1 else "--address HOST:PORT"
    raise RayAddressError(
        f"--address: {len(running)} Ray instance(s) already run on this machine "
        f"({', '.join(running)}) and none was chosen; pass {hint} to run on one of them, or "
        "--address local to start a cluster of this job's own beside them")


def connect(address: str | None = None) -> None:
    """``ray.init`` on the checked address (a local cluster gets :data:`RAY_ENV` and a token
    first), Ray's log lines at WARNING; SIGTERM then interrupts the driver as Ctrl-C does."""
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
    """Start Ray Train's autoscaling coordinator (a detached actor each run asks, waiting at
    most 5 s) while the job does other work, so that a slow start does not cost the first run
    a traceback and 5 s."""
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )

        get_or_create_autoscaling_coordinator()  # asynchronous: the actor starts meanwhile
    except Exception:  # noqa: BLE001 - an optimisation only
        pass


if __name__ == "__main__":  # ``export NAME="${NAME:-value}"`` lines, for a shell's eval
    print("\n".join(f'export {name}="${{{name}:-{value}}}"'
                    for name, value in {**RAY_ENV, **HEAD_ENV}.items()))
