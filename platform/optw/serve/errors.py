"""The planner's one error type."""

from __future__ import annotations

from typing import Any

from optw.errors import OptwError


def clip(value: Any, limit: int = 80) -> str:
    """``value`` as text of at most about ``limit`` characters, to echo in an error message."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class PlanError(OptwError):
    """A request the planner cannot serve: HTTP ``status``, ``field`` and message (cut short)."""

    def __init__(self, status: int, field: str | None, message: str):
        self.status = status
        self.field = None if field is None else clip(field, 120)
        self.message = clip(message, 800)
        super().__init__(self.message)

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.message, "field": self.field, "status": self.status}
