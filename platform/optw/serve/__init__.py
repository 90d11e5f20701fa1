"""The trip planner (``docs/planner.md``): a Ray Serve application planning itineraries with
each region's champion model, and ``optw plan`` in-process. Ray and FastAPI are imported only
by :mod:`optw.serve.app`, loaded on first use."""

from __future__ import annotations

from typing import Any

from optw.serve.errors import PlanError
from optw.serve.models import CheckpointModels, LoadedModel, RegistryModels
from optw.serve.planner import Planner
from optw.serve.preferences import PREFERENCES, preference_scores
from optw.serve.request import MAX_BODY_BYTES, format_time, parse_time

__all__ = [
    "MAX_BODY_BYTES", "PREFERENCES", "CheckpointModels", "LoadedModel", "PlanError", "Planner",
    "RegistryModels", "build_app", "format_time", "parse_time", "preference_scores",
    "start_planner", "stop_planner",
]


def __getattr__(name: str) -> Any:
    if name in ("build_app", "start_planner", "stop_planner"):
        from optw.serve import app

        return getattr(app, name)
    raise AttributeError(f"module 'optw.serve' has no attribute {name!r}")
