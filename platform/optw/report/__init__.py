"""Static HTML reports of platform jobs, read from MLflow (``optw report``): ``index.html``
and ``plots/*.png`` (docs/report.md)."""

from optw.report.build import write_and_log_report, write_report
from optw.report.data import JobData, find_parent_run, load_job

__all__ = ["JobData", "find_parent_run", "load_job", "write_and_log_report", "write_report"]
