"""Static HTML reports of platform jobs, read from MLflow (``optw report``).

A report is one folder: ``index.html`` (inline CSS, no scripts, nothing fetched from the
network) and ``plots/*.png`` (matplotlib, Agg). See ``docs/report.md``.

    from optw.report import write_report
    index = write_report(parent_run_id, "runs/optw-smoke/report")
"""

from optw.report.build import ARTIFACT_DIR, INDEX, write_and_log_report, write_report
from optw.report.data import JobData, find_parent_run, load_job

__all__ = ["ARTIFACT_DIR", "INDEX", "JobData", "find_parent_run", "load_job",
           "write_and_log_report", "write_report"]
