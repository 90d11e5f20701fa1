"""A job's or sweep's early checks of a Ray cluster, before anything trains: a region worker
must fit on a node, every location must be the same on every node (docs/cluster.md)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from optw.distributed import storage as st
from optw.distributed.mirror import PROBE_PREFIX, mirror_dir
from optw.errors import ConfigError
from optw.train.config import check_devices

if TYPE_CHECKING:
    from optw.distributed.profile import JobProfile, ResourcesSection

#: Filesystem types shared between machines (``/proc/mounts``).
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "ceph", "glusterfs", "gpfs", "beegfs",
              "fuse.s3fs", "fuse.gcsfuse", "fuse.mountpoint-s3", "fuse.juicefs", "fuse.sshfs",
              "fuse.cephfs", "fuse.glusterfs", "virtiofs", "9p")
RAY_BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"  # the autoscaler's (``ray up``), on the head
PROBE_TIMEOUT_S = 180.0  # seconds every node gets to answer the early check
CATALOG_SETTING = "--catalog (or OPTW_CATALOG)"


class ClusterStorageError(st.StorageError):
    """A location or store that some node of the Ray cluster cannot reach."""


class Setting(NamedTuple):
    """A location the job uses and the setting that chooses it (named in errors)."""

    name: str  # e.g. "--storage (or OPTW_STORAGE)"
    location: str


def network_fs(path: str | Path) -> str | None:
    """The type of the shared filesystem ``path`` is on (``nfs4``...), None if local."""
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
    """How many worker nodes the cluster launcher may add (its ``max_workers``; 0 without)."""
    try:
        import yaml

        data = yaml.safe_load(Path(config).expanduser().read_text()) or {}
        return int(data.get("max_workers", 0) or 0)
    except Exception:  # noqa: BLE001 - unreadable: no evidence of more nodes
        return 0


def alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def worker_slots(need: dict[str, float], nodes: list[dict[str, Any]] | None = None) -> int:
    """How many region workers asking for ``need`` the ``nodes`` hold at once (at least 1)."""
    nodes = alive_nodes() if nodes is None else nodes
    return max(1, sum(_holds(n, need) for n in nodes))


def worker_need(resources: ResourcesSection, use_gpu: bool,
                extra: Mapping[str, float] | None = None) -> dict[str, float]:
    """What one region worker asks Ray for: CPUs, a GPU share, custom resources ``extra``."""
    gpu = {"GPU": resources.gpu_fraction} if use_gpu else {}
    return {"CPU": resources.cpus_per_region, **gpu, **(extra or {})}


def _holds(node: dict[str, Any], need: dict[str, float]) -> int:
    have = node.get("Resources", {})
    asked = {k: float(v) for k, v in need.items() if v > 0}
    return int(min((have.get(k, 0.0) + 1e-9) // v for k, v in asked.items())) if asked else 1


def check_worker_fits(cpus: float, gpu: float | None = None,
                      nodes: list[dict[str, Any]] | None = None, can_add: int | None = None,
                      where: str = "") -> None:
    """Refuse a region worker no node can hold (Ray would wait for ever) unless ``can_add``."""
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


def join_cluster(folders: list[Setting], catalog: Setting, mirror: str | Path,
                 tracking_uri: str, profile: JobProfile, address: str | None,
                 ) -> tuple[int, bool]:
    """Connect to Ray and check the cluster; returns the node count and whether it has GPUs."""
    import ray

    from optw.distributed.rayenv import connect

    if not ray.is_initialized():
        connect(address)  # a bad --address: refused in seconds, nothing created yet
    use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    for table, config in profile.configs():  # before any worker starts
        check_devices(config, int(use_gpu), f"{profile.profile} {table}")
    res = profile.resources
    check_worker_fits(res.cpus_per_region, res.gpu_fraction if use_gpu else None,
                      where=f"{profile.profile} [resources]")
    st.prepare_folders(folders)
    stage = {catalog.location: str(mirror)} if st.is_uri(catalog.location) else None
    return check_cluster([*folders, catalog], tracking_uri, stage_catalogs=stage), use_gpu


def _probe_node(probes: list[str], token: str, stage: list[tuple[str, str]],
                ) -> list[tuple[int, str]]:
    """On one node: (index, problem) pairs of bad probes, then of catalogs it cannot mirror."""
    problems: list[tuple[int, str]] = []
    for i, probe in enumerate(probes):
        try:
            if st.read_bytes(probe).decode() != token:
                problems.append((i, "it holds another file there"))
        except FileNotFoundError:
            problems.append((i, "it is not there"))
        except Exception as exc:  # noqa: BLE001 - reported with the setting's name
            problems.append((i, f"{type(exc).__name__}: {exc}".splitlines()[0]))
    for j, (uri, mirror) in enumerate(stage, start=len(probes)):
        try:
            mirror_dir(uri, mirror)
        except Exception as exc:  # noqa: BLE001
            problems.append((j, f"cannot mirror it: {exc}".splitlines()[0]))
    return problems


def check_cluster(settings: list[Setting], tracking_uri: str, *,
                  stage_catalogs: Mapping[str, str] | None = None,
                  nodes: list[dict[str, Any]] | None = None,
                  autoscaling: int | None = None) -> int:
    """Refuse a tracking store or location some node cannot reach; returns the node count."""
    from optw.tracking.uri import check_cluster_tracking

    nodes = alive_nodes() if nodes is None else nodes
    extra = autoscaling_workers() if autoscaling is None else autoscaling
    count = max(len(nodes), 1 + extra)
    if count <= 1:
        return len(nodes)
    check_cluster_tracking(tracking_uri, count)
    if extra:
        for setting in settings:
            path = st.local_path(setting.location)
            if path is not None and network_fs(path) is None:
                raise ClusterStorageError(
                    f"{setting.name} {st.shown(setting.location)}: a folder on this node's own "
                    f"disk, but the Ray cluster adds up to {extra} worker node(s) on demand; "
                    f"{_hint(setting)}")
    if len(nodes) <= 1:
        return count
    token = uuid.uuid4().hex
    probes: list[str] = []
    try:
        for setting in settings:
            probe = st.join(setting.location, f"{PROBE_PREFIX}{token}")
            try:
                st.makedirs(setting.location)
                st.write_bytes(probe, token.encode())
            except Exception as exc:  # noqa: BLE001 - one line naming the setting
                raise ClusterStorageError(f"{setting.name} {st.shown(setting.location)}: cannot "
                                          f"write there ({st.first_line(exc)})") from None
            probes.append(probe)
        stage = list((stage_catalogs or {}).items())
        problems = _run_probes(nodes, probes, token, stage)
    finally:
        for probe in probes:
            st.delete(probe)
    if not problems:
        return count
    node, index, problem = problems[0]
    where = f"node {node['NodeManagerAddress']} ({node['NodeID'][:8]})"
    if index >= len(settings):
        uri = stage[index - len(settings)][0]
        raise ClusterStorageError(f"{CATALOG_SETTING} {st.shown(uri)}: {where} {problem}")
    setting = settings[index]
    cannot = (f"{setting.name} {st.shown(setting.location)}: {where} of the {len(nodes)}-node "
              "Ray cluster cannot")
    if st.is_uri(setting.location):
        raise ClusterStorageError(
            f"{cannot} read it ({problem}); give every node access (e.g. the AWS_* variables in "
            f"the environment of its `ray start`) or change {setting.name}")
    raise ClusterStorageError(f"{cannot} see what this node wrote there ({problem}): a path on "
                              f"one node's disk; {_hint(setting)}")


def _run_probes(nodes: list[dict[str, Any]], probes: list[str], token: str,
                stage: list[tuple[str, str]]) -> list[tuple[dict[str, Any], int, str]]:
    """One probe task per node (pinned to it); its problems, in node order."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(_probe_node)
    refs = {task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node["NodeID"], soft=False)).remote(probes, token, stage): node for node in nodes}
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
    if pending:
        late = ", ".join(refs[r]["NodeManagerAddress"] for r in pending)
        for ref in pending:
            ray.cancel(ref, force=True)
        raise ClusterStorageError(
            f"node(s) {late} of the Ray cluster did not answer the storage check within "
            f"{PROBE_TIMEOUT_S:.0f} s; check that they can start Ray workers (`ray status`)")
    return [(node, i, problem) for ref, node in refs.items() for i, problem in ray.get(ref)]
