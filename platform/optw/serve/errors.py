"""The planner's one error type, shared by request parsing, profiles, the model cache and the
service."""

from __future__ import annotations

from typing import Any

from optw.errors import OptwError

#: Longest echo of a caller's value in an error message (characters).
ECHO_CHARS = 80
#: Longest error message and field name: a safety net behind the echo limit.
MAX_MESSAGE_CHARS, MAX_FIELD_CHARS = 800, 120


def clip(value: Any, limit: int = ECHO_CHARS) -> str:
    """``value`` as text of at most about ``limit`` characters, for echoing a caller's input
    in an error message (a 200 KB key or profile name is not sent back)."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class PlanError(OptwError):
    """A request the planner cannot serve: HTTP ``status``, offending ``field``, message
    (both cut to :data:`MAX_FIELD_CHARS` / :data:`MAX_MESSAGE_CHARS`: input echoed by any
    check stays small). The service answers it as JSON; ``optw plan`` names the option."""

    def __init__(self, status: int, field: str | None, message: str):
        field = None if field is None else clip(field, MAX_FIELD_CHARS)
        message = clip(message, MAX_MESSAGE_CHARS)
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.message, "field": self.field, "status": self.status}
