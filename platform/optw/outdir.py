"""Output folders a command owns. A command writes into a folder that is absent, empty, holds
its kind's marker file (``.optw-<kind>``: the entries of its output and, for a job, the job's
name) or only what that kind wrote before markers existed; anything else is refused with an
:class:`OutDirError`: a file, a folder of other files, another command's output, another job's.
In its own folder a command replaces its own earlier output and leaves every other file there
as it is: no file of the user's is ever deleted. :func:`replace_dir` builds the output in a
hidden sibling folder and swaps it in (a failure leaves the old output)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from optw.errors import UserError

PREFIX = ".optw-"
_NAME, _OUTPUT = "name: ", "output: "


class OutDirError(UserError):
    """The output path is a file, or a folder this kind of output may not write into."""

    def __init__(self, path: Path, reason: str, option: str | None = None):
        super().__init__(f"{option} {path}: {reason}" if option else f"{path} {reason}")
        self.path, self.reason, self.option = path, reason, option


def marker(kind: str) -> str:
    """The marker file of a ``kind`` output folder (e.g. ``.optw-report``)."""
    return f"{PREFIX}{kind}"


def _a(kind: str) -> str:
    """``kind`` with its indefinite article (``a report``, ``an evaluation``)."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def _listed(names: Iterable[str]) -> str:
    names = sorted(names)
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


@dataclass(frozen=True)
class Marker:
    """A marker's content: ``output`` None for one written before markers listed it."""

    kind: str
    name: str | None
    output: frozenset[str] | None


def write_marker(folder: Path, kind: str, output: Iterable[str], note: str = "",
                 name: str | None = None) -> Path:
    """Mark ``folder`` as ``kind``'s output of the entries ``output`` (of job ``name``)."""
    lines = [f"optw {kind}{': ' + note if note else ''}", *([_NAME + name] if name else []),
             *(_OUTPUT + entry for entry in sorted(set(output)))]
    path = folder / marker(kind)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def read_marker(path: Path) -> Marker | None:
    """The marker at ``path`` (a file named ``.optw-<kind>`` starting ``optw <kind>``), else
    None (another file, unreadable)."""
    kind = path.name.removeprefix(PREFIX)
    if not path.name.startswith(PREFIX) or not kind:
        return None
    try:
        if not path.is_file() or path.stat().st_size > 1 << 20:
            return None
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    if not lines or lines[0].split(":", 1)[0] != f"optw {kind}":
        return None
    name = next((ln.removeprefix(_NAME) for ln in lines if ln.startswith(_NAME)), None)
    output = frozenset(ln.removeprefix(_OUTPUT) for ln in lines if ln.startswith(_OUTPUT))
    return Marker(kind, name, output or None)


@dataclass(frozen=True)
class Folder:
    """A checked output folder: its resolved ``path``, the entries of its ``own`` earlier
    output, the ``other`` entries that stay, and whether its marker lists its output."""

    path: Path
    own: frozenset[str] = frozenset()
    other: frozenset[str] = frozenset()
    listed: bool = True


def inspect_out_dir(out: str | Path, kind: str, legacy: frozenset[str] = frozenset(),
                    option: str | None = None, name: str | None = None) -> Folder:
    """``out`` as a :class:`Folder` when ``kind`` (of job ``name``) may write there, else an
    :class:`OutDirError`; ``legacy``: what ``kind`` wrote before markers existed."""
    given = Path(out)
    path = given.resolve()

    def refuse(reason: str) -> OutDirError:
        return OutDirError(given if option else path, reason, option)

    if not path.exists():
        if path.is_symlink() or given.is_symlink():
            raise refuse("is a broken link; choose another folder")
        return Folder(path)
    if not path.is_dir():
        raise refuse(f"is a file, not a folder; choose a new folder or {_a(kind)} folder")
    try:
        names = frozenset(p.name for p in path.iterdir())
    except OSError as exc:
        raise refuse(f"cannot be listed ({exc.strerror or exc})") from None
    markers = {m.kind: m for n in names if n.startswith(PREFIX)
               if (m := read_marker(path / n)) is not None}
    if others := sorted(set(markers) - {kind}):
        raise refuse(f"holds {_a(others[0])}'s output ({marker(others[0])}), not "
                     f"{_a(kind)}'s; choose a new or an empty folder")
    mine = markers.get(kind)
    if mine is None:
        if names <= legacy:
            return Folder(path, names)
        raise refuse(f"holds other files ({_listed(names - legacy)}) and is not {_a(kind)} "
                     "folder; choose a new or an empty folder")
    if name is not None and mine.name is not None and mine.name != name:
        raise refuse(f"holds the output of {kind} {mine.name!r}, not of {kind} {name!r}; "
                     "choose a new or an empty folder")
    rest = names - {marker(kind)}
    own = rest & (mine.output if mine.output is not None else legacy)
    return Folder(path, own, rest - own, mine.output is not None)


def check_out_dir(out: str | Path, kind: str, legacy: frozenset[str] = frozenset(),
                  option: str | None = None, name: str | None = None) -> Path:
    """``out`` resolved, when ``kind`` may write there (:func:`inspect_out_dir`)."""
    return inspect_out_dir(out, kind, legacy, option, name).path


@contextmanager
def replace_dir(out: str | Path, kind: str, note: str = "",
                legacy: frozenset[str] = frozenset(), option: str | None = None,
                ) -> Iterator[Path]:
    """Yield a hidden folder beside ``out`` that replaces its earlier ``kind`` output, marked,
    if no error; other files in ``out`` are moved across, never replaced."""
    given = out
    path = check_out_dir(out, kind, legacy, option)
    tag = uuid.uuid4().hex[:8]
    tmp = path.parent / f".{path.name}.tmp-{tag}"
    old = path.parent / f".{path.name}.old-{tag}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as exc:  # a file on the way, no permission
        reason = f"cannot be written ({exc.strerror or exc}: {exc.filename or path.parent})"
        raise OutDirError(Path(given) if option else path, reason, option) from None
    moved: list[str] = []
    try:
        yield tmp
        new = frozenset(p.name for p in tmp.iterdir())
        found = inspect_out_dir(given, kind, legacy, option)  # as it is now
        # an unlisted marker's folder: what the output writes again was its own
        other = found.other - new if not found.listed else found.other
        if clash := other & new:
            raise OutDirError(Path(given) if option else path, f"holds other files "
                              f"({_listed(clash)}) where {_a(kind)} writes its own; move them "
                              "away or choose a new or an empty folder", option)
        write_marker(tmp, kind, new, note)
        for entry in sorted(other):  # the user's files go across, untouched
            os.replace(path / entry, tmp / entry)
            moved.append(entry)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException:
        if old.exists() and not path.exists():
            os.replace(old, path)
        back = True
        for entry in moved:
            try:
                os.replace(tmp / entry, path / entry)
            except OSError:
                back = False
        if back:  # else the user's files stay in tmp rather than be deleted
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old.exists():  # anything put there since the check is not ours: kept
        late = {p.name for p in old.iterdir()} - found.own - new - {marker(kind)}
        for entry in late:
            with suppress(OSError):
                os.replace(old / entry, path / entry)
        if not any((old / entry).exists() for entry in late):
            shutil.rmtree(old, ignore_errors=True)
