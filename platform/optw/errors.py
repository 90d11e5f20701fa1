"""The project's error types. An :class:`OptwError` is meant for the user (bad input, a missing
file, an unreachable service): the command line prints it in one line naming what was wrong
and exits 2. Any other exception is a bug: one line saying so, with where it happened, exit 1.
"""

from __future__ import annotations


class OptwError(Exception):
    """An error meant for the user; its message names the bad input, file or service."""


class UserError(OptwError, ValueError):
    """A bad value, option or file content (a ``ValueError``, so callers that catch those keep
    working)."""


class ConfigError(UserError):
    """A settings table with unknown keys or bad values; ``key`` names the bad setting (a dotted
    path such as ``model.d_model``) when one does."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key
