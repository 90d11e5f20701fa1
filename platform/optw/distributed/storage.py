"""Where a job keeps what must outlive a node, and how every node of a Ray cluster reaches it.

A *location* is one of

- a local folder: the single-node default (``runs/ray_train``, ``runs/<job>``);
- a folder every node mounts at the same path (NFS, EFS, a CephFS mount): also a plain path;
- a URI that pyarrow's filesystems open, as Ray Train does: ``s3://bucket/prefix``, and an
  S3-compatible server with ``?endpoint_override=host:port&scheme=http`` (credentials from the
  usual ``AWS_*`` variables of each node), ``gs://``, ``hdfs://`` ... (``file://`` is a path).

Ray Train gets it as ``RunConfig(storage_path=..., storage_filesystem=...)`` (:func:`ray_storage`);
the job writes its final models, results and report through it (:func:`put_file`,
:func:`upload_dir`); a process that needs a file as a local path gets one with
:func:`local_file`. A catalog given as a URI is mirrored into a node-local cache by every
process that reads it (:func:`local_catalog`), and the job pushes the ILS results it adds back.

:func:`check_cluster` is the job's early refusal: on a Ray cluster of several nodes, every
location must be the same on every node (each node reads a probe file the driver wrote) and
the tracking store must be a server. It runs before any training and names the setting to
change. See docs/cluster.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import posixpath
import shutil
import tempfile
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optw import paths

if TYPE_CHECKING:
    import pyarrow.fs

#: Files of the early check (left behind only if the driver dies in between).
PROBE_PREFIX = ".optw-probe-"
MIRROR_STATE = ".optw-mirror.json"
#: Filesystem types that are shared between machines (``/proc/mounts``): a folder on one of them
#: is accepted on a cluster whose worker nodes are not up yet.
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "ceph", "glusterfs", "gpfs", "beegfs",
              "fuse.s3fs", "fuse.gcsfuse", "fuse.mountpoint-s3", "fuse.juicefs", "fuse.sshfs",
              "fuse.cephfs", "fuse.glusterfs", "virtiofs", "9p")
#: Where the cluster launcher (``ray up``) leaves the autoscaler's config on the head.
RAY_BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"
#: Seconds every node gets to answer the early check.
PROBE_TIMEOUT_S = 180.0


class StorageError(RuntimeError):
    """A location that cannot be used (one line naming the setting that chose it)."""


class ClusterStorageError(StorageError):
    """A location or store that some node of the Ray cluster cannot reach (raised before any
    training starts)."""


# ----------------------------------------------------------------------------- locations


def is_uri(location: str | Path) -> bool:
    """True for ``scheme://...`` other than ``file://`` (those are handled as paths)."""
    text = str(location)
    scheme = urllib.parse.urlsplit(text).scheme
    return "://" in text and len(scheme) > 1 and scheme != "file"


def normalize(location: str | Path) -> str:
    """A URI as given (without a trailing slash), or an absolute local path."""
    text = str(location)
    if is_uri(text):
        parts = urllib.parse.urlsplit(text)
        return urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/")))
    if text.startswith("file://"):
        text = urllib.parse.unquote(urllib.parse.urlsplit(text).path)
    return str(Path(text).expanduser().absolute())


#: Query options of a URI that are never shown (credentials pyarrow accepts in the URI).
_SECRET_OPTIONS = ("access_key", "secret_key", "session_token", "password", "token")


def shown(location: str | Path) -> str:
    """A location for messages: credentials in a URI's query replaced by ``***``."""
    text = str(location)
    if not is_uri(text) or "?" not in text:
        return text
    split = urllib.parse.urlsplit(text)
    pairs = urllib.parse.parse_qsl(split.query, keep_blank_values=True)
    if not any(k.lower() in _SECRET_OPTIONS for k, _ in pairs):
        return text
    query = [(k, "***" if k.lower() in _SECRET_OPTIONS else v) for k, v in pairs]
    return urllib.parse.urlunsplit(split._replace(
        query=urllib.parse.urlencode(query, safe="*:/")))


def join(location: str | Path, *parts: str) -> str:
    """``location`` with ``parts`` appended to its path (a URI keeps its query)."""
    return paths.join_location(normalize(location), *parts)


def local_path(location: str | Path) -> Path | None:
    """The local path of a location, None for a URI."""
    return None if is_uri(location) else Path(normalize(location))


@functools.lru_cache(maxsize=16)
def _uri_fs(uri: str) -> tuple[pyarrow.fs.FileSystem, str]:
    import pyarrow.fs

    return pyarrow.fs.FileSystem.from_uri(uri)


def filesystem(location: str | Path) -> tuple[pyarrow.fs.FileSystem, str]:
    """The pyarrow filesystem of a location and the path on it (what Ray Train resolves)."""
    location = normalize(location)
    if is_uri(location):
        return _uri_fs(location)
    import pyarrow.fs

    return pyarrow.fs.LocalFileSystem(), location


def ray_storage(location: str | Path) -> tuple[str, pyarrow.fs.FileSystem | None]:
    """``(storage_path, storage_filesystem)`` for Ray Train's ``RunConfig``: a local path as
    is, a URI as its filesystem and the path on it (so its query options are kept)."""
    location = normalize(location)
    if not is_uri(location):
        return location, None
    fs, path = filesystem(location)
    return path, fs


def _info(location: str):
    fs, path = filesystem(location)
    return fs.get_file_info(path)


def exists(location: str | Path) -> bool:
    """True if a file or folder is there (an object store has a folder once it holds files)."""
    import pyarrow.fs

    return _info(normalize(location)).type != pyarrow.fs.FileType.NotFound


def is_file(location: str | Path) -> bool:
    import pyarrow.fs

    return _info(normalize(location)).type == pyarrow.fs.FileType.File


def makedirs(location: str | Path) -> None:
    """Create the folder (and its parents); for an object store, the bucket must exist."""
    location = normalize(location)
    if not is_uri(location):
        Path(location).mkdir(parents=True, exist_ok=True)
        return
    fs, path = filesystem(location)
    fs.create_dir(path, recursive=True)


def prepare_folders(folders: list[tuple[str, str | Path]]) -> list[str]:
    """Create each ``(setting, location)`` folder if needed, after checking them all (nothing
    is created when one is wrong): a file there, or a location that cannot be reached or
    written (no bucket, no credentials), raises one line naming its setting."""
    checked = []
    for setting, location in folders:
        location = normalize(location)
        try:
            if is_file(location):
                raise NotADirectoryError(f"{setting}: {shown(location)} is a file, not a folder")
        except NotADirectoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - pyarrow's errors span lines
            raise StorageError(f"{setting}: cannot reach {shown(location)} "
                               f"({_first_line(exc)})") from None
        checked.append((setting, location))
    for setting, location in checked:
        try:
            makedirs(location)
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"{setting}: cannot create {shown(location)} "
                               f"({_first_line(exc)})") from None
    return [location for _, location in checked]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def read_bytes(location: str | Path) -> bytes:
    fs, path = filesystem(location)
    with fs.open_input_stream(path) as f:
        return f.read()


def write_bytes(location: str | Path, data: bytes) -> None:
    """Write a file whole: a local file through a temporary file and a rename (readers never
    see half of it); an object is written in one request."""
    location = normalize(location)
    if not is_uri(location):
        Path(location).parent.mkdir(parents=True, exist_ok=True)
        paths.replace_atomic(location, lambda tmp: tmp.write_bytes(data))
        return
    fs, path = filesystem(location)
    with fs.open_output_stream(path) as f:
        f.write(data)


def delete(location: str | Path) -> None:
    """Delete a file (nothing if it is not there)."""
    fs, path = filesystem(location)
    with contextlib.suppress(FileNotFoundError, OSError):
        fs.delete_file(path)


def put_file(src: str | Path, location: str | Path) -> str:
    """Copy a local file to ``location`` whole (see :func:`write_bytes`); returns the location."""
    location = normalize(location)
    if not is_uri(location):
        Path(location).parent.mkdir(parents=True, exist_ok=True)
        paths.replace_atomic(location, lambda tmp: shutil.copyfile(src, tmp))
        return location
    fs, path = filesystem(location)
    with open(src, "rb") as fin, fs.open_output_stream(path) as fout:
        shutil.copyfileobj(fin, fout, 8 * 1024 * 1024)
    return location


def get_file(location: str | Path, dst: str | Path) -> Path:
    """Copy the file at ``location`` to the local file ``dst`` (through a rename)."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    fs, path = filesystem(location)

    def copy(tmp: Path) -> None:
        with fs.open_input_stream(path) as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout, 8 * 1024 * 1024)

    return paths.replace_atomic(dst, copy)


def upload_dir(src: str | Path, location: str | Path) -> str:
    """Copy every file under the local folder ``src`` to the folder ``location``."""
    src = Path(src)
    for file in sorted(p for p in src.rglob("*") if p.is_file()):
        put_file(file, join(location, *file.relative_to(src).parts))
    return normalize(location)


@contextlib.contextmanager
def local_file(location: str | Path) -> Iterator[Path]:
    """A local path of the file at ``location`` for the block: the path itself, or a
    temporary download of a URI (deleted afterwards)."""
    path = local_path(location)
    if path is not None:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="optw-fetch-") as tmp:
        name = posixpath.basename(filesystem(location)[1]) or "file"
        yield get_file(location, Path(tmp) / name)


# ----------------------------------------------------------------------------- catalog


def default_mirror(uri: str) -> Path:
    """This node's mirror of a catalog URI: ``<cache>/catalog-<hash of the URI>``."""
    digest = hashlib.sha256(normalize(uri).encode()).hexdigest()[:16]
    return paths.cache_dir() / f"catalog-{digest}"


@contextlib.contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def mirror_dir(uri: str, dest: str | Path) -> Path:
    """Make the local folder ``dest`` a copy of the folder at ``uri``: files that changed
    (size or modification time) are downloaded again, files gone are removed. Safe for
    several processes of one node at once (a lock file beside ``dest``)."""
    import pyarrow.fs

    dest = Path(dest)
    fs, root = filesystem(uri)
    try:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=True,
                                                         allow_not_found=True))
    except OSError as exc:
        raise FileNotFoundError(f"{shown(uri)}: cannot list it ({_first_line(exc)})") from None
    files = {posixpath.relpath(i.path, root): [i.size, i.mtime_ns] for i in infos
             if i.type == pyarrow.fs.FileType.File
             and not posixpath.basename(i.path).startswith(PROBE_PREFIX)}
    if not files:
        raise FileNotFoundError(
            f"{shown(uri)}: no files there; publish a built catalog with `python -m "
            f"optw.distributed.storage upload-catalog region_catalog '{shown(uri)}'`")
    with _locked(dest.with_name(f".{dest.name}.lock")):
        state_file = dest / MIRROR_STATE
        state = json.loads(state_file.read_text()) if state_file.is_file() else {}
        for rel, stamp in files.items():
            target = dest.joinpath(*rel.split("/"))
            if state.get(rel) != stamp or not target.is_file():
                get_file(join(uri, *rel.split("/")), target)
        for rel in set(state) - set(files):
            dest.joinpath(*rel.split("/")).unlink(missing_ok=True)
        paths.write_text_atomic(state_file, json.dumps(files))
    return dest


def local_catalog(catalog: str | Path, mirror: str | Path | None = None) -> str:
    """A catalog folder this process can open: a path as is, a URI mirrored into ``mirror``
    (default :func:`default_mirror`) and brought up to date."""
    if not is_uri(catalog):
        return normalize(catalog)
    return str(mirror_dir(normalize(catalog), mirror or default_mirror(str(catalog))))


def upload_catalog(src: str | Path, dst: str) -> bool:
    """Publish a built catalog folder at ``dst`` (a URI or a shared folder) unless the same
    build is there already (same ``manifest.json``); the manifest goes last, so a reader never
    pairs a new manifest with old files. Returns True if it uploaded."""
    src = Path(src)
    manifest = src / "manifest.json"
    if not manifest.is_file():
        raise FileNotFoundError(f"{src} holds no built catalog (no manifest.json); build it "
                                f"with `optw catalog build --out {src}`")
    target = join(dst, "manifest.json")
    if exists(target) and read_bytes(target) == manifest.read_bytes():
        return False
    for file in sorted(p for p in src.rglob("*") if p.is_file() and p != manifest):
        put_file(file, join(dst, *file.relative_to(src).parts))
    put_file(manifest, target)
    return True


def push_baselines(local: str | Path, catalog: str) -> None:
    """Upload the ILS results the job added to a local mirror back to the catalog URI."""
    folder = Path(local) / "baselines"
    if is_uri(catalog) and folder.is_dir():
        upload_dir(folder, join(catalog, "baselines"))


# ----------------------------------------------------------------------------- Ray Train


def needs_localizing(spec: Any) -> bool:
    """True if a worker spec names its catalog or its start model by URI."""
    return is_uri(spec.catalog) or bool(spec.init and is_uri(spec.init))


def train_worker_anywhere(loop_config: dict[str, Any]) -> None:
    """Ray Train worker function for specs that name URIs: mirrors the catalog and fetches
    each start model on this node, then runs :func:`optw.distributed.ray_train.train_worker`
    with local paths (the specs it gets are otherwise unchanged)."""
    from optw.distributed.ray_train import train_worker

    with contextlib.ExitStack() as stack:
        specs = []
        for spec in loop_config["specs"]:
            changes: dict[str, Any] = {}
            if is_uri(spec.catalog):
                changes["catalog"] = local_catalog(spec.catalog)
            if spec.init and is_uri(spec.init):
                changes["init"] = str(stack.enter_context(local_file(spec.init)))
            specs.append(spec.replace(**changes) if changes else spec)
        train_worker({**loop_config, "specs": tuple(specs)})


# ----------------------------------------------------------------------------- the early check


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
                    f"({_first_line(exc)})") from None
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


def main(argv: list[str] | None = None) -> None:
    """``python -m optw.distributed.storage upload-catalog SRC DST`` (what ray_cluster.yaml's
    head runs at setup)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m optw.distributed.storage",
                                     description="Job storage helpers (see docs/cluster.md).")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("upload-catalog", help="publish a built catalog at a URI or folder")
    up.add_argument("src", help="the built catalog folder")
    up.add_argument("dst", help="e.g. s3://bucket/optw/catalog")
    args = parser.parse_args(argv)
    done = upload_catalog(args.src, args.dst)
    print(f"catalog {'uploaded to' if done else 'already current at'} {shown(args.dst)}")


if __name__ == "__main__":
    main()
