"""The job's early refusal on a Ray cluster of several nodes (:func:`check_cluster`).

Every location the job uses must be the same on every node (each node reads a probe file the
driver wrote) and the tracking store must be a server; on a cluster whose autoscaler may add
nodes, a local path must be on a shared filesystem. It runs before any training and names the
setting to change. See docs/cluster.md.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optw.distributed.mirror import PROBE_PREFIX, mirror_dir
from optw.distributed.storage import (
    StorageError,
    delete,
    first_line,
    is_uri,
    join,
    local_path,
    makedirs,
    read_bytes,
    shown,
    write_bytes,
)
from optw.errors import ConfigError

#: Filesystem types that are shared between machines (``/proc/mounts``): a folder on one of them
#: is accepted on a cluster whose worker nodes are not up yet.
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "ceph", "glusterfs", "gpfs", "beegfs",
              "fuse.s3fs", "fuse.gcsfuse", "fuse.mountpoint-s3", "fuse.juicefs", "fuse.sshfs",
              "fuse.cephfs", "fuse.glusterfs", "virtiofs", "9p")
#: Where the cluster launcher (``ray up``) leaves the autoscaler's config on the head.
RAY_BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"
#: Seconds every node gets to answer the early check.
PROBE_TIMEOUT_S = 180.0


class ClusterStorageError(StorageError):
    """A location or store that some node of the Ray cluster cannot reach (raised before any
    training starts)."""


@dataclass(frozen=True)
class Setting:
    """A location the job uses and the setting that chooses it (named in errors)."""

    name: str  # e.g. "--storage (or OPTW_STORAGE)"
    location: str


def network_fs(path: str | Path) -> str | None:
    """The type of the shared filesystem ``path`` is on (``nfs4``, ``fuse.s3fs``...), None if
    it is on a local one (or the mount table cannot be read)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    path = os.path.realpath(path)
    best, kind = "", None
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind if kind in NETWORK_FS else None


def autoscaling_workers(config: str | Path = RAY_BOOTSTRAP_CONFIG) -> int:
    """How many worker nodes the cluster launcher may add (``max_workers`` of the autoscaler
    config ``ray up`` leaves on the head; 0 without one)."""
    path = Path(config).expanduser()
    if not path.is_file():
        return 0
    try:
        import yaml

        data = yaml.safe_load(path.read_text()) or {}
        return int(data.get("max_workers", 0) or 0)
    except Exception:  # noqa: BLE001 - unreadable: no evidence of more nodes
        return 0


def alive_nodes() -> list[dict[str, Any]]:
    """The alive nodes of the connected Ray cluster (``NodeID``, ``NodeManagerAddress``...)."""
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def worker_slots(need: dict[str, float], nodes: list[dict[str, Any]] | None = None) -> int:
    """How many region workers asking for ``need`` (Ray resources of one node: ``CPU``, maybe
    ``GPU`` and custom ones) the cluster's nodes hold at once, node by node (two nodes of 3
    CPUs hold two 2-CPU workers, not three); at least 1 (a cluster whose launcher adds nodes
    may have none yet). ``nodes``: the connected cluster's (:func:`alive_nodes`) unless
    given."""
    nodes = alive_nodes() if nodes is None else nodes
    return max(1, sum(_holds(n, need) for n in nodes))


def _holds(node: dict[str, Any], need: dict[str, float]) -> int:
    """How many workers asking for ``need`` fit on ``node`` (an :func:`alive_nodes` entry);
    a small tolerance keeps fractions (GPU shares) whole."""
    have = node.get("Resources", {})
    asked = {k: float(v) for k, v in need.items() if v > 0}
    return int(min((have.get(k, 0.0) + 1e-9) // v for k, v in asked.items())) if asked else 1


def check_worker_fits(cpus: float, gpu: float | None = None,
                      nodes: list[dict[str, Any]] | None = None, can_add: int | None = None,
                      where: str = "") -> None:
    """Refuse a region worker (``resources.cpus_per_region`` CPUs and, with GPUs, ``gpu`` of
    one, on one node) that no node of the cluster can hold: Ray would wait for one for ever.
    A cluster whose launcher may add nodes is left to wait for them. ``nodes``, ``can_add``:
    the connected cluster's (:func:`alive_nodes`, :func:`autoscaling_workers`) unless given;
    ``where`` (the profile and its table) starts the error."""
    nodes = alive_nodes() if nodes is None else nodes
    can_add = autoscaling_workers() if can_add is None else can_add
    need = {"CPU": cpus, **({"GPU": gpu} if gpu is not None else {})}
    if can_add or any(_holds(n, need) for n in nodes):
        return
    most = max((n.get("Resources", {}).get("CPU", 0.0) for n in nodes), default=0.0)
    largest = "node of this cluster" if len(nodes) > 1 else "this Ray instance"
    raise ConfigError(f"{where + ': ' if where else ''}resources.cpus_per_region = {cpus:g}: "
                      f"each region worker asks one node for {cpus:g} CPUs"
                      f"{' and a GPU share' if gpu is not None else ''}, but the largest "
                      f"{largest} has {most:g} CPUs; lower cpus_per_region (a worker would "
                      "wait for ever)", "resources.cpus_per_region")


def _hint(setting: Setting) -> str:
    return (f"set {setting.name} to a folder every node mounts at the same path (NFS, EFS) or to "
            "an s3:// URI (see docs/cluster.md)")


def _probe_node(checks: list[tuple[str, str, str]], stage: list[tuple[str, str]],
                ) -> list[tuple[int, str]]:
    """Runs on one node: each (setting, probe file, token) must read back the token; each
    (catalog URI, mirror folder) is mirrored there. Returns (check index, problem) pairs."""
    problems: list[tuple[int, str]] = []
    for i, (_name, probe, token) in enumerate(checks):
        try:
            if read_bytes(probe).decode() != token:
                problems.append((i, "it holds another file there"))
        except FileNotFoundError:
            problems.append((i, "it is not there"))
        except Exception as exc:  # noqa: BLE001 - reported with the setting's name
            problems.append((i, f"{type(exc).__name__}: {exc}".splitlines()[0]))
    for j, (uri, mirror) in enumerate(stage, start=len(checks)):
        try:
            mirror_dir(uri, mirror)
        except Exception as exc:  # noqa: BLE001
            problems.append((j, f"cannot mirror it: {exc}".splitlines()[0]))
    return problems


def check_cluster(settings: list[Setting], tracking_uri: str, *,
                  stage_catalogs: Mapping[str, str] | None = None,
                  nodes: list[dict[str, Any]] | None = None,
                  autoscaling: int | None = None,
                  timeout: float = PROBE_TIMEOUT_S) -> int:
    """The job's early refusal on a Ray cluster of several nodes; returns how many nodes the
    cluster has (or may have, with an autoscaler).

    With one node (and no autoscaler that adds more) nothing is checked. Otherwise the
    tracking store must be a server (:func:`optw.tracking.uri.check_cluster_tracking`) and
    every location must be reachable from every alive node: the driver writes a probe file into
    each and one task per node reads them back (an object store is probed the same way, which
    also tests each node's credentials). On a cluster whose autoscaler may add nodes, a local
    path must also be on a shared filesystem. ``stage_catalogs`` (catalog URI -> this
    driver's mirror folder) are mirrored on every node at the same path on the way.
    Raises :class:`ClusterStorageError` (or ``TrackingUnavailableError``) naming the setting.
    """
    from optw.tracking.uri import check_cluster_tracking

    nodes = alive_nodes() if nodes is None else nodes
    extra = autoscaling_workers() if autoscaling is None else autoscaling
    count = max(len(nodes), 1 + extra)  # the most nodes the cluster may have
    if count <= 1:
        return len(nodes)
    check_cluster_tracking(tracking_uri, count)
    if extra:
        for setting in settings:
            path = local_path(setting.location)
            if path is not None and network_fs(path) is None:
                raise ClusterStorageError(
                    f"{setting.name} {shown(setting.location)}: a folder on this node's own disk, "
                    f"but the Ray cluster adds up to {extra} worker node(s) on demand; "
                    f"{_hint(setting)}")
    if len(nodes) <= 1:
        return count
    token = uuid.uuid4().hex
    checks: list[tuple[str, str, str]] = []
    try:
        for setting in settings:
            probe = join(setting.location, f"{PROBE_PREFIX}{token}")
            try:
                makedirs(setting.location)
                write_bytes(probe, token.encode())
            except Exception as exc:  # noqa: BLE001 - one line naming the setting
                raise ClusterStorageError(
                    f"{setting.name} {shown(setting.location)}: cannot write there "
                    f"({first_line(exc)})") from None
            checks.append((setting.name, probe, token))
        stage = list((stage_catalogs or {}).items())
        problems = _run_probes(nodes, checks, stage, timeout)
    finally:
        for _, probe, _ in checks:
            delete(probe)
    for node, index, problem in problems:
        where = f"node {node['NodeManagerAddress']} ({node['NodeID'][:8]})"
        if index < len(settings):
            setting = settings[index]
            if is_uri(setting.location):
                raise ClusterStorageError(
                    f"{setting.name} {shown(setting.location)}: {where} of the {len(nodes)}-node "
                    f"Ray cluster cannot read it ({problem}); give every node access (e.g. the "
                    "AWS_* variables in the environment of its `ray start`) or change "
                    f"{setting.name}")
            raise ClusterStorageError(
                f"{setting.name} {shown(setting.location)}: {where} of the {len(nodes)}-node Ray "
                f"cluster cannot see what this node wrote there ({problem}): a path on one "
                f"node's disk; {_hint(setting)}")
        uri = stage[index - len(settings)][0]
        raise ClusterStorageError(f"--catalog (or OPTW_CATALOG) {shown(uri)}: {where} {problem}")
    return count


def _run_probes(nodes: list[dict[str, Any]], checks: list[tuple[str, str, str]],
                stage: list[tuple[str, str]], timeout: float,
                ) -> list[tuple[dict[str, Any], int, str]]:
    """One probe task per node (pinned to it); its problems, in node order."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(_probe_node)
    refs = {task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node["NodeID"], soft=False)).remote(checks, stage): node for node in nodes}
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    if pending:
        late = ", ".join(refs[r]["NodeManagerAddress"] for r in pending)
        for ref in pending:
            ray.cancel(ref, force=True)
        raise ClusterStorageError(
            f"node(s) {late} of the Ray cluster did not answer the storage check within "
            f"{timeout:.0f} s; check that they can start Ray workers (`ray status`)")
    out = []
    for ref in refs:
        out += [(refs[ref], i, problem) for i, problem in ray.get(ref)]
    return out
