"""File I/O on a *location*: a local or shared folder, or a URI that pyarrow's filesystems
open as Ray Train does (``s3://...``; a ``file://`` URI is a path). See docs/cluster.md."""

from __future__ import annotations

import contextlib
import functools
import posixpath
import shutil
import tempfile
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optw import paths
from optw.errors import OptwError

if TYPE_CHECKING:
    import pyarrow.fs

CHUNK = 8 * 1024 * 1024  # bytes a copy moves at a time


class StorageError(OptwError, RuntimeError):
    """A location that cannot be used (one line naming the setting that chose it)."""


class NotAFolderError(StorageError, NotADirectoryError):
    """A location that must be a folder is a file."""


class LocationNotFound(StorageError, FileNotFoundError):
    """Nothing at a location that must hold something (a catalog URI, a built catalog)."""


def is_uri(location: str | Path) -> bool:
    """True for ``scheme://...`` other than ``file://`` (those are handled as paths)."""
    scheme = urllib.parse.urlsplit(str(location)).scheme
    return "://" in str(location) and len(scheme) > 1 and scheme != "file"


def normalize(location: str | Path) -> str:
    """A URI as given (without a trailing slash), or an absolute local path."""
    text = str(location)
    if is_uri(text):
        parts = urllib.parse.urlsplit(text)
        return urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/")))
    if text.startswith("file://"):
        text = urllib.parse.unquote(urllib.parse.urlsplit(text).path)
    return str(Path(text).expanduser().absolute())


_SECRET_OPTIONS = ("access_key", "secret_key", "session_token", "password", "token")  # hidden


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
    """``(storage_path, storage_filesystem)`` for Ray Train's ``RunConfig``."""
    fs, path = filesystem(location)
    return path, fs if is_uri(location) else None


def _file_type(location: str | Path) -> str:
    fs, path = filesystem(location)
    return fs.get_file_info(path).type.name


def exists(location: str | Path) -> bool:
    """True if a file or folder is there (an object store has a folder once it holds files)."""
    return _file_type(location) != "NotFound"


def is_file(location: str | Path) -> bool:
    return _file_type(location) == "File"


def makedirs(location: str | Path) -> None:
    """Create the folder (and its parents); for an object store, the bucket must exist."""
    fs, path = filesystem(location)
    fs.create_dir(path, recursive=True)


def prepare_folders(folders: list[tuple[str, str | Path]], create: bool = True) -> list[str]:
    """Check (then create) each ``(setting, location)`` folder; returns them normalized."""
    checked = [(setting, normalize(location)) for setting, location in folders]
    for setting, location in checked:
        if _try(setting, "reach", is_file, location):
            raise NotAFolderError(f"{setting}: {shown(location)} is a file, not a folder")
    for setting, location in checked if create else ():
        _try(setting, "create", makedirs, location)
    return [location for _, location in checked]


def _try(setting: str, doing: str, action: Callable[[str], object], location: str) -> object:
    """``action(location)``; any error as one line naming ``setting``."""
    try:
        return action(location)
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors span lines
        raise StorageError(f"{setting}: cannot {doing} {shown(location)} "
                           f"({first_line(exc)})") from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def read_bytes(location: str | Path) -> bytes:
    fs, path = filesystem(location)
    with fs.open_input_stream(path) as f:
        return f.read()


def _write(location: str | Path, local: Callable[[Path], object],
           remote: Callable[[Any], object]) -> str:
    """Write a file whole: a local one through a rename, an object in one request."""
    location = normalize(location)
    if is_uri(location):
        fs, path = filesystem(location)
        with fs.open_output_stream(path) as f:
            remote(f)
    else:
        Path(location).parent.mkdir(parents=True, exist_ok=True)
        paths.replace_atomic(location, local)
    return location


def write_bytes(location: str | Path, data: bytes) -> None:
    """Write ``data`` to ``location`` whole (:func:`_write`)."""
    _write(location, lambda tmp: tmp.write_bytes(data), lambda f: f.write(data))


def delete(location: str | Path) -> None:
    """Delete a file (nothing if it is not there)."""
    fs, path = filesystem(location)
    with contextlib.suppress(FileNotFoundError, OSError):
        fs.delete_file(path)


def put_file(src: str | Path, location: str | Path) -> str:
    """Copy a local file to ``location`` whole (as :func:`write_bytes`); returns the location."""
    def upload(f: Any) -> None:
        with open(src, "rb") as fin:
            shutil.copyfileobj(fin, f, CHUNK)

    return _write(location, lambda tmp: shutil.copyfile(src, tmp), upload)


def get_file(location: str | Path, dst: str | Path) -> Path:
    """Copy the file at ``location`` to the local file ``dst`` (through a rename)."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    fs, path = filesystem(location)

    def copy(tmp: Path) -> None:
        with fs.open_input_stream(path) as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout, CHUNK)

    return paths.replace_atomic(dst, copy)


def upload_dir(src: str | Path, location: str | Path, skip: Path | None = None) -> None:
    """Copy every file but ``skip`` under the local folder ``src`` to the folder ``location``."""
    for file in sorted(p for p in Path(src).rglob("*") if p.is_file() and p != skip):
        put_file(file, join(location, *file.relative_to(src).parts))


@contextlib.contextmanager
def local_file(location: str | Path) -> Iterator[Path]:
    """A local path of the file at ``location`` (a URI: a temporary download)."""
    if (path := local_path(location)) is not None:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="optw-fetch-") as tmp:
        name = posixpath.basename(filesystem(location)[1]) or "file"
        yield get_file(location, Path(tmp) / name)
