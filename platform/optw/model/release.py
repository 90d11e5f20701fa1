"""Released global models: one weights file and one JSON manifest per benchmark group, in
``optw/model/releases/`` (they ship with the package; ``$OPTW_RELEASES`` names another folder;
docs/releases.md). The platform makes them itself (``optw release make``); :func:`load_release`
is the one way to load them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from optw.model.checkpoint import CheckpointError, load_model
from optw.model.config import ModelConfig
from optw.model.network import PointerNet
from optw.paths import file_sha256, releases_dir


class ReleaseError(CheckpointError):
    """A release that is missing, altered or of another architecture."""


def release_groups(folder: Path | None = None) -> list[str]:
    """Groups with a release, sorted."""
    return sorted(p.stem for p in (folder or releases_dir()).glob("*.json"))


def release_manifest(group: str, folder: Path | None = None) -> dict[str, Any]:
    """A group's manifest (a :class:`ReleaseError` naming the group if it has none)."""
    path = (folder or releases_dir()) / f"{group}.json"
    if not path.is_file():
        have = release_groups(folder)
        raise ReleaseError(f"no released model for group {group!r} in {path.parent} "
                           f"(releases: {', '.join(have) or 'none'})")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReleaseError(f"{path}: not a readable release manifest ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("group") != group:
        raise ReleaseError(f"{path}: not the manifest of group {group!r}")
    return manifest


def checked_release(group: str, folder: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The group's weights file, its sha256 checked against the manifest, and the manifest."""
    folder = folder or releases_dir()
    manifest = release_manifest(group, folder)
    path = folder / str(manifest.get("file", f"{group}.pt"))
    if not path.is_file():
        raise ReleaseError(f"release {group}: its weights file {path} is missing")
    if (digest := file_sha256(path)) != manifest.get("sha256"):
        raise ReleaseError(f"release {group}: {path} has sha256 {digest[:16]}…, its manifest "
                           f"{manifest.get('sha256', '?')[:16]}…; the file was altered or "
                           "replaced: restore both from git")
    return path, manifest


def load_release(group: str, folder: Path | None = None) -> tuple[PointerNet, dict[str, Any]]:
    """The group's released model (eval mode) and its manifest, after checking the file's
    sha256 and that its architecture is the manifest's."""
    path, manifest = checked_release(group, folder)
    model = load_model(path)
    have = model.cfg.to_dict()
    want = ModelConfig.from_dict(dict(manifest.get("architecture", {}))).to_dict()
    if have != want:
        diff = sorted(k for k in want if have.get(k) != want[k])
        raise ReleaseError(f"release {group}: {path} holds another architecture than its "
                           f"manifest ({', '.join(diff)})")
    return model, manifest
