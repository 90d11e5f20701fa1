"""Output folders a command owns: written whole, never over anything it did not write.

A command that writes a folder of outputs (``optw report --out``, ``optw evaluate --out``, ...)
writes it through :func:`replace_dir`: the new outputs are built in a hidden sibling folder and
moved into place in one rename, with a marker file naming the kind of output. So

- a folder is replaced only when it is absent, empty, or holds that kind's marker (an output
  of the same command); a file, or a folder of other files, is an :class:`OutDirError` that
  names it, and nothing is moved or deleted;
- a replaced folder is replaced as a whole: nothing of the previous output stays beside the
  new one;
- a failure leaves the previous output as it was, and a reader never sees a half-written one.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from optw.errors import UserError


class OutDirError(UserError):
    """The output path is a file, or a folder that this kind of output did not write."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path} {reason}")
        self.path, self.reason = path, reason


def marker(kind: str) -> str:
    """The marker file of a ``kind`` output folder (e.g. ``.optw-report``)."""
    return f".optw-{kind}"


def check_out_dir(out: str | Path, kind: str, legacy: frozenset[str] = frozenset()) -> Path:
    """``out`` resolved, when a ``kind`` output may replace it: absent, an empty folder, or a
    folder holding :func:`marker` (or only names of ``legacy``: outputs written before markers
    existed). Raises :class:`OutDirError` otherwise."""
    out = Path(out).resolve()
    if not out.exists():
        if out.is_symlink():
            raise OutDirError(out, "is a broken link; choose another folder")
        return out
    if not out.is_dir():
        raise OutDirError(out, f"is a file, not a folder; choose a new folder or a {kind} "
                               "folder")
    names = {p.name for p in out.iterdir()}
    if marker(kind) in names or (legacy and names <= legacy) or not names:
        return out
    listed = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
    raise OutDirError(out, f"holds other files ({listed}) and is not a {kind} folder; choose a "
                           f"new or an empty folder (a {kind} replaces its folder as a whole)")


@contextmanager
def replace_dir(out: str | Path, kind: str, note: str = "",
                legacy: frozenset[str] = frozenset()) -> Iterator[Path]:
    """Yield a fresh hidden folder beside ``out`` to write a ``kind`` output into; when the
    block ends without an error it replaces ``out`` as a whole (with the marker, holding
    ``note``). ``out`` is checked before and again just before the rename
    (:func:`check_out_dir`)."""
    out = check_out_dir(out, kind, legacy)
    out.parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    tmp = out.parent / f".{out.name}.tmp-{tag}"
    old = out.parent / f".{out.name}.old-{tag}"
    tmp.mkdir()
    try:
        yield tmp
        (tmp / marker(kind)).write_text(f"optw {kind}{': ' + note if note else ''}\n",
                                        encoding="utf-8")
        check_out_dir(out, kind, legacy)  # nobody put other files there meanwhile
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not out.exists():
            os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
