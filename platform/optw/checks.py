"""Checking helpers of every settings table: value predicates, one error format naming the
key, dataclasses built from tables, and TOML / YAML / JSON files read into tables."""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from pathlib import Path
from typing import Any

from optw.errors import ConfigError


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
