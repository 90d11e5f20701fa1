"""Parsers for the three benchmark formats (see each folder's FORMAT.txt).

- Solomon and Cordeau (TOPTW): ``k v N t`` / ``D Q`` / N+1 rows ``i x y d S f a list[a] O C``;
  node 0 is start and end and its closing time is T_end.
- Gavalas (TTDP): ``k M SD N ...`` / start row ``0 x y d S O C`` / N rows
  ``i x y d S t open0 close0 ... open6 close6 b``; M must be 1 and SD picks the day.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

import numpy as np

from optw.catalog.region import Region
from optw.errors import UserError

#: Instance file names accepted per group folder.
FILE_PATTERNS = {
    "solomon": re.compile(r"^(c|r|rc)[12]\d\d\.txt$"),
    "cordeau": re.compile(r"^pr\d\d\.txt$"),
    "gavalas": re.compile(r"^t\d{3}\.txt$"),
}
DECIMALS = {"solomon": 1, "cordeau": 2, "gavalas": 2}


class SourceError(UserError):
    """A malformed or inconsistent benchmark file (names the file, the line and the problem)."""

    def __init__(self, path: Path | str, line: int | None, problem: str):
        self.path, self.line, self.problem = str(path), line, problem
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")


class _Lines:
    def __init__(self, path: Path, text: str):
        self.path = path
        self.rows = [(no, ln.split()) for no, ln in enumerate(text.splitlines(), 1) if ln.strip()]

    def error(self, line: int | None, problem: str) -> SourceError:
        return SourceError(self.path, line, problem)

    def numbers(self, idx: int, what: str) -> tuple[int, list[float]]:
        """Line number and values of data row ``idx`` (``what`` names it in errors)."""
        if idx >= len(self.rows):
            raise self.error(None, f"file ends early: {what} (data row {idx + 1}) is missing")
        no, fields = self.rows[idx]
        values = []
        for f in fields:
            try:
                values.append(float(f))
            except ValueError:
                raise self.error(no, f"non-numeric field {f!r} in {what}") from None
        if not all(math.isfinite(v) for v in values):
            raise self.error(no, f"non-finite value in {what}")
        return no, values

    def integer(self, no: int, value: float, what: str) -> int:
        if value != int(value) or value < 0:
            raise self.error(no, f"{what} must be a non-negative integer, got {value:g}")
        return int(value)

    def check_vertex(self, no: int, got: float, expected: int) -> None:
        if got != expected:
            raise self.error(no, f"vertex number {got:g} where {expected} was expected")

    def check_point(self, no: int, d: float, o: float, c: float) -> None:
        if d < 0:
            raise self.error(no, f"negative visit duration {d:g}")
        if o > c:
            raise self.error(no, f"opening time {o:g} is after closing time {c:g}")


def _region(group: str, path: Path, raw: bytes, start: list[float], points: np.ndarray) -> Region:
    """Assemble a Region from the start row and point rows ``[n, 6]``, each (x, y, duration,
    score, opening, closing); the start row's opening and closing are T_start and T_end."""
    if points.shape[0] == 0:
        raise SourceError(path, None, "the instance has no points of interest")
    sx, sy, _, _, t_start, t_end = start

    def col(j: int, end_value: float) -> np.ndarray:  # the start and end nodes get end_value
        return np.concatenate([[end_value], points[:, j], [end_value]])

    return Region(
        id=path.stem, group=group, x=col(0, sx), y=col(1, sy), duration=col(2, 0.0),
        score=col(3, 0.0), opening=col(4, t_start), closing=col(5, t_end),
        t_start=float(t_start), t_end=float(t_end), decimals=DECIMALS[group],
        source_file=f"{group}/{path.name}", source_hash=hashlib.sha256(raw).hexdigest())


def parse_toptw(path: Path, group: str, raw: bytes) -> Region:
    """Solomon / Cordeau format."""
    lines = _Lines(path, raw.decode("utf-8", errors="replace"))
    no, header = lines.numbers(0, "header 'k v N t'")
    if len(header) < 3:
        raise lines.error(no, f"header needs at least 3 fields 'k v N ...', got {len(header)}")
    n = lines.integer(no, header[2], "vertex count N")
    lines.numbers(1, "line 'D Q'")
    if (got_rows := len(lines.rows) - 2) != n + 1:
        raise lines.error(lines.rows[-1][0], f"header says N={n} vertices (+ node 0), but the "
                          f"file has {got_rows} vertex rows")
    rows = []  # (x, y, duration, score, opening, closing) of node 0, then of each point
    for i in range(n + 1):
        no, v = lines.numbers(2 + i, f"vertex {i}")
        if len(v) < 9:
            raise lines.error(no, f"vertex row has {len(v)} fields, at least 9 expected")
        a = lines.integer(no, v[6], "list length a")
        if len(v) != 9 + a:
            raise lines.error(no, f"vertex row has {len(v)} fields, expected 9 + a = {9 + a} "
                              f"(a={a})")
        lines.check_vertex(no, v[0], i)
        lines.check_point(no, v[3], v[-2], v[-1])
        rows.append([v[1], v[2], v[3], v[4], v[-2], v[-1]])
    points = np.array(rows[1:], dtype=np.float64).reshape(-1, 6)
    return _region(group, path, raw, rows[0], points)


def parse_ttdp(path: Path, group: str, raw: bytes) -> Region:
    """Gavalas single-day TTDP format."""
    lines = _Lines(path, raw.decode("utf-8", errors="replace"))
    no, header = lines.numbers(0, "header 'k M SD N ...'")
    if len(header) < 4:
        raise lines.error(no, f"header needs at least 4 fields 'k M SD N', got {len(header)}")
    if (tours := lines.integer(no, header[1], "number of tours M")) != 1:
        raise lines.error(no, f"multi-day instance (M={tours} tours); only M=1 is supported")
    day = lines.integer(no, header[2], "start day SD")
    if day > 6:
        raise lines.error(no, f"start day SD={day} is outside 0..6")
    n = lines.integer(no, header[3], "vertex count N")
    no, start = lines.numbers(1, "start row 'i x y d S O C'")
    if len(start) != 7:
        raise lines.error(no, f"start row has {len(start)} fields, expected 7")
    lines.check_vertex(no, start[0], 0)
    lines.check_point(no, start[3], start[5], start[6])
    if (got_rows := len(lines.rows) - 2) != n:
        raise lines.error(lines.rows[-1][0], f"header says N={n} points, but the file has "
                          f"{got_rows} point rows")
    points = np.empty((n, 6), dtype=np.float64)
    for i in range(n):
        no, v = lines.numbers(2 + i, f"point {i + 1}")
        if len(v) != 21:
            raise lines.error(no, f"point row has {len(v)} fields, expected 21")
        lines.check_vertex(no, v[0], i + 1)
        o, c = v[6 + 2 * day], v[7 + 2 * day]
        lines.check_point(no, v[3], o, c)
        points[i] = (v[1], v[2], v[3], v[4], o, c)
    return _region(group, path, raw, start[1:], points)


def parse_file(path: Path | str, group: str) -> Region:
    """Parse one instance file of ``group``; the region id is the file stem."""
    path = Path(path)
    if group not in FILE_PATTERNS:
        raise SourceError(path, None, f"unknown group {group!r}; expected {list(FILE_PATTERNS)}")
    if not FILE_PATTERNS[group].match(path.name):
        raise SourceError(path, None, f"unknown file name {path.name!r} for group {group} "
                          f"(expected names like {FILE_PATTERNS[group].pattern})")
    return (parse_ttdp if group == "gavalas" else parse_toptw)(path, group, path.read_bytes())


def discover(source: Path | str) -> list[tuple[str, Path]]:
    """All (group, file) pairs under ``source/{solomon,cordeau,gavalas}/``, sorted; every file
    other than FORMAT.txt and hidden ones must be a known instance name of its group."""
    source = Path(source)
    if not source.is_dir():
        raise SourceError(source, None, "benchmark folder not found (set OPTW_BENCHMARKS)")
    found = []
    for group, pattern in FILE_PATTERNS.items():
        if not (folder := source / group).is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.name == "FORMAT.txt" or path.name.startswith("."):
                continue
            if not pattern.match(path.name):
                raise SourceError(path, None, f"unknown file name {path.name!r} in {group}/")
            found.append((group, path))
    if not found:
        raise SourceError(source, None, "no instance files under solomon/, cordeau/, gavalas/")
    return found
