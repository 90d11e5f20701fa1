"""The planner's one error type."""

from __future__ import annotations

from typing import Any

from optw.errors import OptwError

#: Longest error message and field name: a safety net behind the echo limit.
MAX_MESSAGE_CHARS, MAX_FIELD_CHARS = 800, 120


def clip(value: Any, limit: int = 80) -> str:
    """``value`` as text of at most about ``limit`` characters, for echoing a caller's input
    in an error message."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class PlanError(OptwError):
    """A request the planner cannot serve: HTTP ``status``, the offending ``field`` and a
    message, both cut short. The service answers it as JSON; ``optw plan`` names the option."""

    def __init__(self, status: int, field: str | None, message: str):
        self.status = status
        self.field = None if field is None else clip(field, MAX_FIELD_CHARS)
        self.message = clip(message, MAX_MESSAGE_CHARS)
        super().__init__(self.message)

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.message, "field": self.field, "status": self.status}
