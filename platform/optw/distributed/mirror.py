"""A catalog URI mirrored on each node that reads it (:func:`local_catalog`); ``python -m
optw.distributed.mirror upload-catalog SRC DST`` publishes a built catalog."""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import posixpath
from pathlib import Path

from optw import paths
from optw.distributed import storage as st

PROBE_PREFIX = ".optw-probe-"  # files the cluster's early check leaves for a moment
MIRROR_STATE = ".optw-mirror.json"


def default_mirror(uri: str) -> Path:
    """This node's mirror of a catalog URI: ``<cache>/catalog-<hash of the URI>``."""
    digest = hashlib.sha256(st.normalize(uri).encode()).hexdigest()[:16]
    return paths.cache_dir() / f"catalog-{digest}"


def mirror_dir(uri: str, dest: str | Path) -> Path:
    """Make the local folder ``dest`` a copy of the folder at ``uri`` (probe files left out);
    safe for several processes of one node at once (a lock file beside ``dest``)."""
    import pyarrow.fs

    dest = Path(dest)
    fs, root = st.filesystem(uri)
    try:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=True,
                                                         allow_not_found=True))
    except OSError as exc:
        raise st.LocationNotFound(
            f"{st.shown(uri)}: cannot list it ({st.first_line(exc)})") from None
    files = {posixpath.relpath(i.path, root): [i.size, i.mtime_ns] for i in infos
             if i.type == pyarrow.fs.FileType.File
             and not posixpath.basename(i.path).startswith(PROBE_PREFIX)}
    if not files:
        raise st.LocationNotFound(
            f"{st.shown(uri)}: no files there; publish a built catalog with `python -m "
            f"optw.distributed.mirror upload-catalog region_catalog '{st.shown(uri)}'`")
    lock = dest.with_name(f".{dest.name}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        state_file = dest / MIRROR_STATE
        state = json.loads(state_file.read_text()) if state_file.is_file() else {}
        for rel, stamp in files.items():
            target = dest.joinpath(*rel.split("/"))
            if state.get(rel) != stamp or not target.is_file():
                st.get_file(st.join(uri, *rel.split("/")), target)
        for rel in set(state) - set(files):
            dest.joinpath(*rel.split("/")).unlink(missing_ok=True)
        paths.write_text_atomic(state_file, json.dumps(files))
    return dest


def local_catalog(catalog: str | Path, mirror: str | Path | None = None) -> str:
    """A catalog folder this process can open: a path, or a URI's mirror."""
    if not st.is_uri(catalog):
        return st.normalize(catalog)
    return str(mirror_dir(st.normalize(catalog), mirror or default_mirror(str(catalog))))


def upload_catalog(src: str | Path, dst: str) -> bool:
    """Publish a built catalog folder at ``dst`` unless the same build is there (True if so)."""
    src = Path(src)
    manifest = src / "manifest.json"
    if not manifest.is_file():
        raise st.LocationNotFound(f"{src} holds no built catalog (no manifest.json); build it "
                                  f"with `optw catalog build --out {src}`")
    target = st.join(dst, "manifest.json")
    if st.exists(target) and st.read_bytes(target) == manifest.read_bytes():
        return False
    st.upload_dir(src, dst, skip=manifest)  # the manifest last: never new with old files
    st.put_file(manifest, target)
    return True


def push_baselines(local: str | Path, catalog: str) -> None:
    """Upload the baselines the job added to a local mirror back to the catalog URI."""
    folder = Path(local) / "baselines"
    if st.is_uri(catalog) and folder.is_dir():
        st.upload_dir(folder, st.join(catalog, "baselines"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m optw.distributed.mirror",
                                     description="Publish a built catalog (see docs/cluster.md).")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("upload-catalog", help="publish a built catalog at a URI or folder")
    up.add_argument("src", help="the built catalog folder")
    up.add_argument("dst", help="e.g. s3://bucket/optw/catalog")
    args = parser.parse_args(argv)
    done = upload_catalog(args.src, args.dst)
    print(f"catalog {'uploaded to' if done else 'already current at'} {st.shown(args.dst)}")


if __name__ == "__main__":
    main()
