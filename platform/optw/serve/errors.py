"""The planner's one error type."""

from __future__ import annotations

from typing import Any

from optw.checks import echoed
from optw.errors import OptwError


class PlanError(OptwError):
    """A request the planner cannot serve: HTTP ``status``, ``field`` and message (cut short)."""

    def __init__(self, status: int, field: str | None, message: str):
        self.status = status
        self.field = None if field is None else echoed(field, 120)
        self.message = echoed(message, 800)
        super().__init__(self.message)

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.message, "field": self.field, "status": self.status}
