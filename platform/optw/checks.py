"""The one vocabulary of checks: value predicates, one error format naming a table's key
(:func:`require`, dataclasses built from tables, TOML / YAML / JSON files read into tables),
and the checks of single values given as options or parameters (:func:`int_in`,
:func:`number_in`, :func:`word`), used by training, jobs and the planner alike."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
from pathlib import Path
from typing import Any

from optw.errors import ConfigError, UserError


def integer(v: Any) -> bool:
    """An int that is not a bool (bool is an int in Python, not in a config)."""
    return type(v) is int


def number(v: Any) -> bool:
    """A finite int or float (not a bool, NaN or infinity)."""
    return type(v) in (int, float) and math.isfinite(v)


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters."""
    try:
        text = repr(value)
    except ValueError:  # an int of over 4300 digits
        return f"an integer of over {limit} digits"
    return text if len(text) <= limit else text[:limit] + "..."


def echoed(value: Any, limit: int = 80) -> str:
    """``value`` as text of at most about ``limit`` characters, to echo in an error message."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_number(text: str) -> float | None:
    """``text`` as a finite number, else None (ASCII only: float() also reads other digits)."""
    try:
        value = float(text) if text.isascii() else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def int_in(value: Any, name: str, lo: int, hi: int, what: str) -> int:
    """``value`` (an int, or its ASCII decimal text) within ``lo..hi``, else a UserError
    ``"<name>: expected <what> in lo..hi, got <value>"`` (options and parameters)."""
    ok = integer(value) or (
        isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d{1,30}\s*", value, re.ASCII))
    if not ok or not lo <= int(value) <= hi:
        raise UserError(f"{name}: expected {what} in {lo}..{hi}, got {echoed(value)!r}")
    return int(value)


def number_in(value: Any, name: str, lo: float, hi: float, what: str) -> float:
    """``value`` (a number, or its text) as a finite float within ``[lo, hi]``, else a
    UserError naming ``name``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out: float | None = float(value)
    else:
        out = parse_number(value) if isinstance(value, str) else None
    if out is None or not math.isfinite(out) or not lo <= out <= hi:
        raise UserError(f"{name}: expected {what}, a finite number in {lo:g}..{hi:g}, "
                        f"got {echoed(value)!r}")
    return out


def word(value: Any, name: str, what: str) -> str:
    """A non-empty string without whitespace or control characters, else a UserError."""
    if not isinstance(value, str) or not value or len(value) > 1000 or \
            any(c.isspace() or not c.isprintable() for c in value):
        raise UserError(f"{name}: expected {what}, got {echoed(value)!r}")
    return value


def require(cond: bool, key: str, value: Any, what: str) -> None:
    """:class:`ConfigError` ``"<key> = <value>: <what>"`` (naming ``key``) unless ``cond``."""
    if not cond:
        raise ConfigError(f"{key} = {shown(value)}: {what}", key)


def from_table(cls, data: dict[str, Any], where: str):
    """Dataclass ``cls`` from a table; a bad key or value is a ConfigError naming ``where``."""
    known = {f.name for f in dataclasses.fields(cls)}
    if unknown := sorted(set(data) - known):
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(known)}")
    try:
        return cls(**data)
    except ConfigError as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith(where) else f"{where}: {msg}", exc.key) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_mapping(path: str | Path) -> dict[str, Any]:
    """Read a TOML, YAML or JSON file into a dict, with errors that name the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    if path.suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise ConfigError(f"{path}: unsupported config format (use .toml, .yaml or .json)")
    try:
        text = path.read_text()
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as exc:  # noqa: BLE001 - TOML, JSON, YAML and decoding errors alike
        raise ConfigError(f"{path}: cannot parse: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table/mapping at the top level")
    return data
