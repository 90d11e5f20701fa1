"""The project's error types: an :class:`OptwError` is meant for the user (the command line
prints it in one line, exit 2); any other exception is a bug (exit 1)."""

from __future__ import annotations


class OptwError(Exception):
    """An error meant for the user; its message names the bad input, file or service."""


class UserError(OptwError, ValueError):
    """A bad value, option or file content (also a ``ValueError``)."""


class ConfigError(UserError):
    """A settings table with unknown keys or bad values; ``key``: the bad setting's dotted path
    (``model.d_model``), if any."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key
