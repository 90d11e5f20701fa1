"""``optw report``: a job's static HTML report from its MLflow runs."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="static HTML report of a job (curves, gaps, time/score, tables)",
        description="Read a job's runs from MLflow and write a self-contained HTML report "
        "(index.html + PNG plots; viewable offline). Without --job or --run: the newest "
        "job in the store.")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--job", default=None, metavar="NAME",
                       help="job (experiment) name: report its newest parent run")
    which.add_argument("--run", default=None, metavar="PARENT_RUN_ID",
                       help="the parent run of the job to report")
    p.add_argument("--tracking-uri", default=None, metavar="URI",
                   help="MLflow store (default: $MLFLOW_TRACKING_URI or the project's "
                   "sqlite store)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="output folder (default: runs/<job>/report): new, empty or a previous "
                   "report's, which is replaced (other files there stay); a file, a folder "
                   "of other files or of another command's output is refused")
    p.set_defaults(func=_report)


def _report(args) -> int:
    from optw.outdir import check_out_dir
    from optw.paths import report_dir
    from optw.report import find_parent_run, load_job, write_report
    from optw.report.build import LEGACY, OUT_KIND
    from optw.tracking import check_tracking_uri

    if args.out is not None:
        check_out_dir(args.out, OUT_KIND, LEGACY, "--out")
    uri = check_tracking_uri(args.tracking_uri, existing=True)
    run_id = args.run or find_parent_run(args.job, uri)
    out = args.out or report_dir(args.job or load_job(run_id, uri).job_name)
    index = write_report(run_id, out, uri, "--out" if args.out is not None else None)
    print(f"wrote {index}")
    print(f"open file://{index.resolve()}")
    return 0
