"""The trip planner: a Ray Serve application that plans itineraries with each region's champion
model, and the same planner in-process for ``optw plan``.

    from optw.serve import start_planner, stop_planner
    url = start_planner(port=8000)   # POST {url}/plan, GET {url}/regions, GET {url}/healthz

See ``docs/planner.md``. Ray and FastAPI are imported only by :mod:`optw.serve.app`, which
``start_planner`` and ``stop_planner`` load on first use.
"""

from __future__ import annotations

from typing import Any

from optw.serve.planner import (
    DEFAULT_BEAMS,
    DEFAULT_PREFERENCE,
    MAX_BEAMS,
    MAX_BODY_BYTES,
    METHODS,
    PREFERENCES,
    CheckpointModels,
    LoadedModel,
    PlanError,
    Planner,
    PlanRequest,
    RegistryModels,
    format_time,
    parse_request,
    parse_time,
    preference_scores,
)

__all__ = [
    "DEFAULT_BEAMS", "DEFAULT_PREFERENCE", "MAX_BEAMS", "MAX_BODY_BYTES", "METHODS",
    "PREFERENCES", "CheckpointModels", "LoadedModel", "PlanError", "PlanRequest", "Planner",
    "RegistryModels", "build_app", "format_time", "parse_request", "parse_time",
    "preference_scores", "start_planner", "stop_planner",
]

_LAZY = ("build_app", "start_planner", "stop_planner")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from optw.serve import app

        return getattr(app, name)
    raise AttributeError(f"module 'optw.serve' has no attribute {name!r}")
