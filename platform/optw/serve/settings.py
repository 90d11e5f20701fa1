"""Checks of the planner's settings (``docs/planner.md``), run before Ray or any work starts:
every bad value is one UserError (an unreachable store a TrackingUnavailableError) starting
with the option's or parameter's name. Nothing is started or written here."""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optw.checks import int_in, number_in, word
from optw.errors import UserError

#: Solves at once per replica (``solve_threads``), each in its own worker thread.
MAX_SOLVE_THREADS = 16
#: Requests a replica accepts at once: well above the solve slots, so that plans wait for a
#: slot inside the replica and ``/healthz`` and bad requests are never queued behind them.
MAX_ONGOING_REQUESTS = 1024
MAX_REPLICAS = 1024
#: Seconds between two checks of a region's champion alias.
DEFAULT_CHECK_INTERVAL = 2.0
MAX_CHECK_INTERVAL = 86400.0
#: Longest a request of a region without a cached model waits for the registry (then 503).
DEFAULT_REGISTRY_TIMEOUT = 10.0
#: End-to-end limit of one HTTP request (Ray Serve answers 408 after it).
DEFAULT_REQUEST_TIMEOUT = 300.0
DEFAULT_READY_TIMEOUT = 60.0
#: Seconds for the reachability checks of the tracking server and a Ray address.
CHECK_TIMEOUT = 3.0

#: ``start_planner`` parameter -> ``optw serve`` option, for error messages.
SERVE_FLAGS = {
    "host": "--host", "port": "--port", "catalog": "--catalog", "tracking_uri": "--tracking-uri",
    "check_interval": "--check-interval", "num_replicas": "--replicas",
    "solve_threads": "--solve-threads", "num_cpus": "--solve-threads",
    "ray_address": "--ray-address", "registry_timeout": "--registry-timeout",
    "request_timeout": "--request-timeout",
}


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """Checked settings of one planner deployment."""

    host: str = "127.0.0.1"
    port: int = 8000
    catalog: str | None = None  # checked: the catalog folder (default $OPTW_CATALOG ...)
    tracking_uri: str | None = None  # checked: the resolved, answering URI
    check_interval: float = DEFAULT_CHECK_INTERVAL
    num_replicas: int = 1
    num_cpus: float = 0.5
    solve_threads: int = 1
    solve_options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    ray_address: str = "local"
    ray_cpus: int | None = None
    ready_timeout: float = DEFAULT_READY_TIMEOUT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    registry_timeout: float = DEFAULT_REGISTRY_TIMEOUT

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def open_catalog_checked(path: str | Path | None, name: str):
    """The catalog at ``path`` (default ``$OPTW_CATALOG`` or ``region_catalog/``), node table
    read; else a UserError naming the option and the folder."""
    from optw.catalog import default_catalog_dir, open_catalog

    if path is not None and not str(path).strip():
        raise UserError(f"{name}: expected a catalog folder, got {str(path)!r}")
    folder = Path(path) if path is not None else default_catalog_dir()
    try:
        catalog = open_catalog(folder)
        if not (regions := catalog.list_regions()):
            raise UserError(f"the region catalog at {folder} holds no region")
        catalog.region(regions[0])  # reads the node table: a broken file fails here
    except Exception as exc:  # CatalogError, OSError, Arrow errors: all say which folder
        detail = " ".join(str(exc).split()) or type(exc).__name__
        where = "" if str(folder) in detail else f"catalog {folder}: "
        raise UserError(f"{name}: {where}{detail}") from None
    return catalog


def tracking_store(uri: str | None, name: str) -> str:
    """The resolved tracking URI, checked to answer within :data:`CHECK_TIMEOUT`; the error
    starts with ``name``, or with ``$MLFLOW_TRACKING_URI`` when the URI came from there."""
    from optw.tracking.uri import ENV_URI, TrackingUnavailableError, check_tracking_uri
    from optw.tracking.uri import tracking_uri as resolve

    if uri is not None:
        word(uri, name, "a tracking URI such as http://127.0.0.1:5000 or sqlite:///PATH")
    label = name if uri else (f"${ENV_URI}" if os.environ.get(ENV_URI) else name)
    try:
        return check_tracking_uri(resolve(uri), timeout=CHECK_TIMEOUT, option=label)
    except TrackingUnavailableError as exc:
        text = str(exc)  # an unknown scheme is already named with the label
        raise TrackingUnavailableError(text if text.startswith(label) else f"{label}: {text}"
                                       ) from None


def local_cpus() -> int:
    """CPUs a local Ray would get (cgroup-aware, as Ray counts them)."""
    try:
        from ray._private.utils import get_num_cpus

        return int(get_num_cpus())
    except Exception:  # a Ray without that helper: the scheduler's view of this process
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)


def check_fit(num_replicas: int, num_cpus: float, total: float, names: Mapping[str, str],
              where: str) -> None:
    """All replicas must fit the CPUs, else some would never start and requests wait."""
    if num_cpus > total + 1e-9:
        raise UserError(f"{names['num_cpus']}: one replica needs {num_cpus:g} CPUs, {where} "
                        f"has {total:g}")
    if (need := num_replicas * num_cpus) > total + 1e-9:
        raise UserError(
            f"{names['num_replicas']}: {num_replicas} replicas of {num_cpus:g} CPU each need "
            f"{need:g} CPUs, {where} has {total:g}; use at most {int((total + 1e-9) // num_cpus)}")


def _bind(host: str, port: int, names: Mapping[str, str]) -> int:
    """Bind ``host:port`` once and return the port (0: a free one); a UserError naming the
    option when the host is not an address of this machine or the port is taken."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise UserError(f"{names['host']}: cannot resolve {host!r} ({reason})") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(f"{names['port']}: port {port} is already in use on {host}; "
                                f"choose another one (0 picks a free port)") from None
            if exc.errno == errno.EACCES:
                raise UserError(f"{names['port']}: not allowed to listen on port {port} "
                                f"(ports below 1024 need root); use 1024..65535") from None
            raise UserError(f"{names['host']}: cannot listen on {host}:{port} "
                            f"({exc.strerror or exc})") from None
        return int(sock.getsockname()[1])


def _ray_address(address: str, name: str) -> str:
    if address in ("local", "auto"):
        return address
    m = re.fullmatch(r"(?:ray://)?\[?([^\[\]]+?)\]?:(\d{1,5})", address)
    if not m or not 1 <= int(m.group(2)) <= 65535:
        raise UserError(f"{name}: expected 'local', 'auto', HOST:PORT or ray://HOST:PORT, got "
                        f"{address!r}")
    try:
        socket.create_connection((m.group(1), int(m.group(2))), timeout=CHECK_TIMEOUT).close()
    except OSError as exc:
        raise UserError(f"{name}: no Ray answers at {address} ({exc.strerror or exc}); start "
                        f"one (`ray start --head`) or use 'local'") from None
    return address


def _solve_options(value: Any, name: str) -> dict[str, dict[str, Any]]:
    from optw.serve.request import METHODS

    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(v, Mapping) for v in value.values()):
        raise UserError(f"{name}: expected {{method: {{argument: value}}}}, got {value!r}")
    if unknown := sorted(set(value) - set(METHODS)):
        raise UserError(f"{name}: unknown method(s) {unknown}; known: {list(METHODS)}")
    return {str(k): dict(v) for k, v in value.items()}


def serve_settings(*, names: Mapping[str, str] | None = None, ray_running: bool = False,
                   **given: Any) -> ServeSettings:
    """Check every setting ``given`` (:class:`ServeSettings`' fields, whose defaults fill the
    rest; cheap ones first, then the catalog, tracking store, Ray address and port) and return
    them resolved. ``names``: parameter -> name in errors (:data:`SERVE_FLAGS`).
    ``ray_running``: Ray is initialised here (CPUs are checked once connected, the port not)."""
    fields = [f.name for f in dataclasses.fields(ServeSettings)]
    if unknown := sorted(set(given) - set(fields)):
        raise TypeError(f"serve_settings: unknown setting(s) {unknown}")
    g = vars(ServeSettings(**given))  # the given values, the defaults for the rest
    n = {k: (names or {}).get(k, k) for k in fields}
    host = word(g["host"], n["host"], "an address to listen on, such as 127.0.0.1 or 0.0.0.0")
    port = int_in(g["port"], n["port"], 0, 65535, "a TCP port (0: any free port)")
    replicas = int_in(g["num_replicas"], n["num_replicas"], 1, MAX_REPLICAS, "a number of replicas")
    threads = int_in(g["solve_threads"], n["solve_threads"], 1, MAX_SOLVE_THREADS,
                     "a number of solves at once per replica")
    cpus = number_in(g["num_cpus"], n["num_cpus"], 0.0, 1024.0, "CPUs per replica")
    interval = number_in(g["check_interval"], n["check_interval"], 0.0, MAX_CHECK_INTERVAL,
                         "seconds between champion checks")
    registry_s = number_in(g["registry_timeout"], n["registry_timeout"], 0.1, 600.0,
                           "seconds a request may wait for the registry")
    request_s = number_in(g["request_timeout"], n["request_timeout"], 1.0, 3600.0,
                          "seconds a request may take")
    ready_s = number_in(g["ready_timeout"], n["ready_timeout"], 1.0, 3600.0,
                        "seconds to wait for the planner to answer")
    ray_cpus_n = None if g["ray_cpus"] is None else int_in(
        g["ray_cpus"], n["ray_cpus"], 1, 4096, "a number of CPUs")
    options = _solve_options(g["solve_options"], n["solve_options"])
    address = word(g["ray_address"], n["ray_address"], "'local', 'auto' or HOST:PORT")
    local = address == "local" and not ray_running  # a local Ray is started here
    if local:
        check_fit(replicas, cpus, ray_cpus_n or local_cpus(), n, "the local Ray")
    cat = open_catalog_checked(g["catalog"], n["catalog"])
    uri = tracking_store(g["tracking_uri"], n["tracking_uri"])
    if not ray_running:
        address = _ray_address(address, n["ray_address"])
    if local:
        port = _bind(host, port, n)
    elif port == 0:
        raise UserError(f"{n['port']}: 0 (any free port) needs a local Ray started here; "
                        f"give a port in 1..65535")
    return ServeSettings(
        host=host, port=port, catalog=str(Path(cat.path).resolve()), tracking_uri=uri,
        check_interval=interval, num_replicas=replicas, num_cpus=cpus, solve_threads=threads,
        solve_options=options, ray_address=address, ray_cpus=ray_cpus_n, ready_timeout=ready_s,
        request_timeout=request_s, registry_timeout=registry_s)
