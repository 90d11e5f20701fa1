"""Output folders a command owns: built in a hidden sibling folder and renamed into place, with
a marker file naming the kind of output; a folder is replaced only when it is absent, empty or
holds that kind's marker (else an :class:`OutDirError`). A failure leaves the old output."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from optw.errors import UserError


class OutDirError(UserError):
    """The output path is a file, or a folder this kind of output did not write."""

    def __init__(self, path: Path, reason: str, option: str | None = None):
        super().__init__(f"{option} {path}: {reason}" if option else f"{path} {reason}")
        self.path, self.reason, self.option = path, reason, option


def marker(kind: str) -> str:
    """The marker file of a ``kind`` output folder (e.g. ``.optw-report``)."""
    return f".optw-{kind}"


def _a(kind: str) -> str:
    """``kind`` with its indefinite article (``a report``, ``an evaluation``)."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def check_out_dir(out: str | Path, kind: str, legacy: frozenset[str] = frozenset(),
                  option: str | None = None) -> Path:
    """``out`` resolved, when a ``kind`` output may replace it, else an :class:`OutDirError`."""
    given = Path(out)
    out = given.resolve()

    def refuse(reason: str) -> OutDirError:
        return OutDirError(given if option else out, reason, option)

    if not out.exists():
        if out.is_symlink() or given.is_symlink():
            raise refuse("is a broken link; choose another folder")
        return out
    if not out.is_dir():
        raise refuse(f"is a file, not a folder; choose a new folder or {_a(kind)} folder")
    try:
        names = {p.name for p in out.iterdir()}
    except OSError as exc:
        raise refuse(f"cannot be listed ({exc.strerror or exc})") from None
    if marker(kind) in names or (legacy and names <= legacy) or not names:
        return out
    listed = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
    raise refuse(f"holds other files ({listed}) and is not {_a(kind)} folder; choose a new "
                 f"or an empty folder ({_a(kind)} replaces its folder as a whole)")


@contextmanager
def replace_dir(out: str | Path, kind: str, note: str = "",
                legacy: frozenset[str] = frozenset(), option: str | None = None,
                ) -> Iterator[Path]:
    """Yield a hidden folder beside ``out`` that replaces it, with the marker, if no error."""
    given = out
    out = check_out_dir(out, kind, legacy, option)
    tag = uuid.uuid4().hex[:8]
    tmp = out.parent / f".{out.name}.tmp-{tag}"
    old = out.parent / f".{out.name}.old-{tag}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as exc:  # a file on the way, no permission
        reason = f"cannot be written ({exc.strerror or exc}: {exc.filename or out.parent})"
        raise OutDirError(Path(given) if option else out, reason, option) from None
    try:
        yield tmp
        (tmp / marker(kind)).write_text(f"optw {kind}{': ' + note if note else ''}\n",
                                        encoding="utf-8")
        check_out_dir(given, kind, legacy, option)  # nobody put other files there meanwhile
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not out.exists():
            os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
