"""The platform job on Ray: profiles, the plan of models per mode, Ray Train runs, the job."""

from optw.distributed.plan import Unit, plan, select_regions
from optw.distributed.profile import MODES, JobProfile, load_profile

__all__ = ["MODES", "JobProfile", "Unit", "load_profile", "plan", "select_regions"]
