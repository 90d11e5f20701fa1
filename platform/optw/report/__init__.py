"""Static HTML reports of platform jobs, read from MLflow (``optw report``): a folder of
``index.html`` (inline CSS, no scripts, nothing from the network) and ``plots/*.png``. See
``docs/report.md``.
"""

from optw.report.build import write_and_log_report, write_report
from optw.report.data import JobData, find_parent_run, load_job

__all__ = ["JobData", "find_parent_run", "load_job", "write_and_log_report", "write_report"]
