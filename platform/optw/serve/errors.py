"""The planner's one error type, shared by request parsing, profiles, the model cache and the
service."""

from __future__ import annotations

from typing import Any


class PlanError(Exception):
    """A request the planner cannot serve: HTTP ``status``, offending ``field``, message."""

    def __init__(self, status: int, field: str | None, message: str):
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.message, "field": self.field, "status": self.status}
