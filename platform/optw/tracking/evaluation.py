"""Evaluation results into a run: per-method metrics and the tables as CSV + Markdown."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from typing import Any

from optw.tracking.uri import get_client


def _name(text: Any) -> str:
    """``text`` as a metric or artifact name (other characters become ``_``)."""
    return re.sub(r"[^\w\-. /:]", "_", str(text)).strip() or "_"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        return _cell(value.item())
    return str(value).replace("|", "\\|").replace("\n", " ")


def to_markdown(table) -> str:
    """A DataFrame as a GitHub Markdown table (no ``tabulate`` needed); floats to 6 digits."""
    cols = [str(c) for c in table.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in table.itertuples(index=False, name=None):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def log_tables(run_id: str, tables: Mapping[str, Any], *, uri: str | None = None,
               artifact_dir: str = "tables") -> list[str]:
    """Log each DataFrame as ``<artifact_dir>/<name>.csv`` and ``.md``; returns the paths."""
    client = get_client(uri)
    paths = []
    for name, table in tables.items():
        base = f"{artifact_dir}/{_name(name)}"
        client.log_text(run_id, table.to_csv(index=False), f"{base}.csv")
        client.log_text(run_id, to_markdown(table), f"{base}.md")
        paths += [f"{base}.csv", f"{base}.md"]
    return paths


def log_evaluation(run_id: str, table, name: str, *, uri: str | None = None) -> dict[str, float]:
    """Log ``<name>/<method>/mean_<score|gap|seconds>`` (``all`` without ``method``), the table."""
    from mlflow.entities import Metric

    if "score" not in table.columns:
        raise ValueError(f"evaluation table {name!r} has no 'score' column "
                         f"(columns: {list(table.columns)})")
    groups = table.groupby("method", sort=True) if "method" in table.columns else [("all", table)]
    metrics: dict[str, float] = {}
    for method, rows in groups:
        for col in ("score", "gap", "seconds"):
            if col in rows.columns:
                value = float(rows[col].astype(float).mean())
                if not math.isnan(value):
                    metrics[f"{_name(name)}/{_name(method)}/mean_{col}"] = value
    if metrics:
        ts = int(time.time() * 1000)
        get_client(uri).log_batch(run_id, metrics=[Metric(k, v, ts, 0) for k, v in metrics.items()])
    log_tables(run_id, {name: table}, uri=uri, artifact_dir="evaluation")
    return metrics
