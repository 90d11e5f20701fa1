"""Reading and checking a results table: one row per (region, tourist, method); an optional
``route`` column (node ids, or a string like ``"0 5 12 101"``) must reproduce ``score``."""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from optw.errors import UserError

REQUIRED = ("region", "tourist", "method", "score", "seconds")
METHOD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+\-]*$")
#: Names taken by baselines; a results table may not use them as method names.
RESERVED_METHODS = ("ils",)
MAX_REPORTED = 10
#: Longest accepted ``seconds`` of a result (about 116 days): larger values are a unit mistake.
MAX_SECONDS = 1e7


class ResultsError(UserError):
    """A results table that cannot be evaluated (the message names the offending rows)."""


def _json_lines(text: str, source: str, name: str) -> pd.DataFrame:
    """The records of JSON-lines ``text``; errors name ``source``, the table's attrs ``name``."""
    records = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ResultsError(f"{source} line {no} is not JSON: {exc}") from None
        except (ValueError, RecursionError) as exc:  # 4300+ digit integers, deep nesting
            raise ResultsError(f"{source} line {no} cannot be read as JSON: "
                               f"{' '.join(str(exc).split())[:120]}") from None
        if not isinstance(rec, dict):
            raise ResultsError(f"{source} line {no} is not a JSON object")
        records.append(rec)
    if not records:
        raise ResultsError(f"{source} is empty")
    df = pd.DataFrame(records)
    df.attrs.update(source=name, csv=False)
    return df


def read_table(path: Path | str) -> pd.DataFrame:
    """A CSV, Parquet or JSON-lines (``-``: standard input) results table as a DataFrame."""
    if str(path) == "-":
        try:
            text = sys.stdin.read()
        except UnicodeDecodeError as exc:
            raise ResultsError(f"standard input is not UTF-8 text ({exc.reason})") from None
        return _json_lines(text, "standard input", "standard input")
    path = Path(path)
    if not path.exists():
        raise ResultsError(f"results file {path} does not exist")
    if not path.is_file():
        raise ResultsError(f"results file {path} is a folder, not a file")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        try:
            text = path.read_bytes().decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ResultsError(f"results file {path} is not UTF-8 text ({exc.reason} at byte "
                               f"{exc.start})") from None
        except OSError as exc:
            raise ResultsError(f"cannot read results file {path} ({exc.strerror or exc})") from None
        return _json_lines(text, f"results file {path}", str(path))
    parquet = suffix in (".parquet", ".pq")
    try:
        df = pd.read_parquet(path) if parquet else pd.read_csv(path, skipinitialspace=True)
    except pd.errors.EmptyDataError as exc:
        raise ResultsError(f"results file {path} is empty") from exc
    except Exception as exc:  # malformed CSV/Parquet: parser errors of several kinds
        raise ResultsError(f"cannot read results file {path}: {exc}") from exc
    df.attrs.update(source=str(path), csv=not parquet)
    return df


def _row(df: pd.DataFrame, i: int) -> str:
    return f"row {i + 1} (line {i + 2})" if df.attrs.get("csv") else f"row {i + 1}"


def _show(value) -> str:
    """repr of a cell without numpy's type wrapper (``1.5``, not ``np.float64(1.5)``)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _parse_route(value) -> list[int] | None:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, str):
        value = [p for p in re.split(r"[\s,;\[\]]+", value) if p]
    return [int(v) for v in value]


def validate_results(df: pd.DataFrame, catalog, baseline: str = "ils",
                     methods: Iterable[str] | None = None,
                     check_routes: bool = True) -> pd.DataFrame:
    """A results table checked against the catalog, with ``kind``, ``group`` and ``exact``."""
    source = df.attrs.get("source", "results table")
    df = df.reset_index(drop=True)  # keeps attrs
    if len(df.columns) == 0 or len(df) == 0:
        raise ResultsError(f"{source} has no rows")
    if missing := [c for c in REQUIRED if c not in df.columns]:
        raise ResultsError(f"{source} lacks column(s) {missing}; expected {list(REQUIRED)} "
                           f"(found {list(map(str, df.columns))})")
    problems: list[str] = []

    def bad(i: int, msg: str) -> None:
        problems.append(f"{_row(df, i)}: {msg}")

    #: region -> tourist id -> (kind, the most it can score: all its points)
    known: dict[str, dict[int, tuple[str, float]]] = {}
    kinds_held = ("benchmark", "validation", *(("paper",) if catalog.has_paper_sets else ()))
    regions = set(catalog.list_regions())
    tourist = pd.to_numeric(df["tourist"], errors="coerce")
    score = pd.to_numeric(df["score"], errors="coerce")
    seconds = pd.to_numeric(df["seconds"], errors="coerce")
    kinds: list[str | None] = []
    for i in range(len(df)):
        kind = total = None
        region, method, t = df["region"].iat[i], df["method"].iat[i], tourist.iat[i]
        if not isinstance(method, str) or not METHOD_RE.match(method):
            bad(i, f"method {_show(method)} is not a valid name (letters, digits, _ . + -)")
        elif method in RESERVED_METHODS or method == baseline:
            bad(i, f"method {method!r} is the name of a baseline; rename it")
        if not isinstance(region, str) or region not in regions:
            close = difflib.get_close_matches(str(region), regions, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            bad(i, f"region {_show(region)} is not in the catalog{hint}")
        elif not np.isfinite(t) or t != int(t):
            bad(i, f"tourist {_show(df['tourist'].iat[i])} is not an integer id")
        else:
            if region not in known:
                batches = [catalog.tourists(region, k) for k in kinds_held
                           if k != "paper" or not catalog.is_custom(region)]  # none of theirs
                known[region] = {int(tid): (b.kind, float(most)) for b in batches for tid, most
                                 in zip(b.tourist_id, b.scores.sum(axis=1), strict=True)}
            kind, total = known[region].get(int(t), (None, None))
            if kind is None:
                bad(i, f"tourist {int(t)} of region {region} is not in the catalog "
                       f"(ids {_id_ranges(known[region])})")
        s, sec = score.iat[i], seconds.iat[i]
        if not np.isfinite(s) or s < 0:
            bad(i, f"score {_show(df['score'].iat[i])} is not a finite number >= 0")
        elif total is not None and s > total * (1 + 1e-9) + 1e-9:
            bad(i, f"score {_show(df['score'].iat[i])} is more than tourist {int(t)} can "
                   f"score in {region} ({total:g}, all its points)")
        if not np.isfinite(sec) or not 0 <= sec <= MAX_SECONDS:
            bad(i, f"seconds {_show(df['seconds'].iat[i])} is not a finite number in "
                   f"[0, {MAX_SECONDS:g}]")
        kinds.append(kind)
        if len(problems) >= MAX_REPORTED:
            break
    if not problems:
        first: dict[tuple, int] = {}
        keys = zip(df["region"], tourist.astype("int64"), df["method"], strict=True)
        for i, (region, tid, method) in enumerate(keys):
            if (j := first.setdefault((region, tid, method), i)) != i:
                bad(i, f"duplicates {_row(df, j)} (region {region}, tourist {tid}, "
                       f"method {method})")
                if len(problems) >= MAX_REPORTED:
                    break
    if problems:
        raise ResultsError(_message(source, problems))

    out = pd.DataFrame({
        "region": df["region"].astype(str), "tourist": tourist.astype("int64"),
        "method": df["method"].astype(str), "score": score.astype("float64"),
        "seconds": seconds.astype("float64"), "kind": kinds})
    out["group"] = out["region"].map(catalog.regions_table["group"])
    inexact = {r for r in out.loc[out["kind"] == "paper", "region"].unique()
               if not catalog.paper_exact(r)}
    out["exact"] = ~((out["kind"] == "paper") & out["region"].isin(inexact))
    if methods is not None:
        methods = list(methods)
        present = sorted(out["method"].unique())
        if unknown := [m for m in methods if m not in present]:
            raise ResultsError(f"method(s) {unknown} not in {source}; it has {present}")
        out = out[out["method"].isin(methods)]
    if check_routes and "route" in df.columns:
        _check_routes(df, out, catalog, source)
    return out.reset_index(drop=True)


def _id_ranges(held: dict[int, tuple[str, float]]) -> str:
    """``0..64`` or ``0..64, paper 1000..1063``: the ids a region's stored tourists have."""
    ours = [t for t, (k, _) in held.items() if k != "paper"]
    paper = [t for t, (k, _) in held.items() if k == "paper"]
    return f"{min(ours)}..{max(ours)}" + (f", paper {min(paper)}..{max(paper)}" if paper else "")


def _check_routes(df: pd.DataFrame, out: pd.DataFrame, catalog, source: str) -> None:
    from optw.env.validate import check_route

    problems: list[str] = []
    for i in out.index:
        try:
            route = _parse_route(df["route"].iat[i])
        except (TypeError, ValueError):
            problems.append(f"{_row(df, i)}: route {df['route'].iat[i]!r} is not a list of ids")
            continue
        if route is None:
            continue
        region = catalog.region(out.at[i, "region"])
        batch = catalog.tourists(region.id, out.at[i, "kind"])
        idx = int(np.flatnonzero(batch.tourist_id == out.at[i, "tourist"])[0])
        chk = check_route(region, route, batch, idx, claimed_score=out.at[i, "score"])
        if not chk.ok:
            problems.append(f"{_row(df, i)}: invalid route: " + "; ".join(chk.problems))
        if len(problems) >= MAX_REPORTED:
            break
    if problems:
        raise ResultsError(_message(source, problems))


def _message(source: str, problems: list[str]) -> str:
    more = " (first problems only)" if len(problems) >= MAX_REPORTED else ""
    return f"{source} is invalid{more}:\n  " + "\n  ".join(problems)


def load_results(path: Path | str, catalog, baseline: str = "ils",
                 methods: Iterable[str] | None = None) -> pd.DataFrame:
    """:func:`read_table` + :func:`validate_results`."""
    return validate_results(read_table(path), catalog, baseline, methods)
