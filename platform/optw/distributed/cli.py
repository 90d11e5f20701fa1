"""Command line of the platform job (used by ``jobs/train_all.py``) and its summary."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from optw.distributed.profile import MODES, JobProfile, load_profile


def job_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train_all.py",
        description="Train, fine-tune, evaluate and register OPTW models for many regions on "
        "Ray + MLflow.")
    p.add_argument("--profile", default="smoke",
                   help="smoke | paper | a TOML/YAML profile file (default: smoke)")
    p.add_argument("--groups", default=None,
                   help="comma-separated groups (solomon,cordeau,gavalas); default: profile")
    p.add_argument("--regions", default=None, help="comma-separated region ids (overrides groups)")
    p.add_argument("--mode", choices=MODES, default=None, help="default: the profile's")
    p.add_argument("--name", default=None, help="job (= MLflow experiment) name")
    p.add_argument("--force", action="store_true",
                   help="retrain regions that already have a champion from this config")
    p.add_argument("--catalog", type=Path, default=None, help="catalog folder")
    p.add_argument("--tracking-uri", default=None, help="MLflow store (default: local sqlite)")
    p.add_argument("--storage", default=None, help="Ray Train storage (shared on a cluster)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default runs/NAME)")
    p.add_argument("--address", default=None, help="Ray address (default: auto/local)")
    p.add_argument("--quiet", action="store_true")
    return p


def profile_from_args(args: argparse.Namespace) -> JobProfile:
    profile = load_profile(args.profile)
    data = profile.to_dict()
    data.pop("profile")
    job = data["job"]
    if args.groups:
        job["groups"] = [g.strip() for g in args.groups.split(",") if g.strip()]
    if args.regions:
        job["regions"] = [r.strip() for r in args.regions.split(",") if r.strip()]
    if args.mode:
        job["mode"] = args.mode
    if args.name:
        job["name"] = args.name
    return JobProfile.from_dict(data, source=profile.profile)


def format_summary(summary) -> str:
    """Per-group table of the job's results and where to look next."""
    from optw.catalog.cli import format_table

    lines = [f"job {summary.job_name}: {len(summary.trained)} model(s) trained, "
             f"{len(summary.skipped)} region(s) skipped (already current), "
             f"{len(summary.registered)} registered, {summary.seconds / 60:.1f} min"]
    table = summary.tables.get("summary") if summary.tables else None
    if table is not None and len(table):
        cols = [c for c in ("group", "kind", "method", "regions", "model", "ils", "gap_ils",
                            "best_known", "gap_best", "time") if c in table.columns]
        rows = table[cols].to_dict("records")
        for r in rows:
            for k, v in r.items():
                if isinstance(v, float):
                    r[k] = round(v, 2)
        lines += ["", format_table(rows, cols)]
    if summary.results_path:
        lines.append(f"\nresults: {summary.results_path}")
    if summary.report:
        lines.append(f"report:  {summary.report}")
    lines.append(f"MLflow: parent run {summary.parent_run_id} in experiment "
                 f"'{summary.job_name}' at {summary.tracking_uri}")
    if summary.tracking_uri.startswith("sqlite"):
        lines.append(f"  see it with: mlflow ui --backend-store-uri {summary.tracking_uri}")
    lines.append("Ray dashboard: http://127.0.0.1:8265 (while the cluster runs)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = job_parser().parse_args(argv)
    from optw.distributed.job import run_job
    from optw.train.config import ConfigError

    try:
        profile = profile_from_args(args)
        summary = run_job(profile, catalog_dir=args.catalog, tracking_uri=args.tracking_uri,
                          storage=args.storage, out_dir=args.out, force=args.force,
                          progress=not args.quiet, ray_address=args.address)
    except (ConfigError, KeyError, ValueError, FileNotFoundError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"train_all: error: {msg}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    return 0
