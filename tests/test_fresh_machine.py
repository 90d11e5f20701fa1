"""A fresh machine: `make run`'s script (``jobs/embedded.sh``) with an empty home folder, its own
Ray temp folder and no ``RAY_AUTH_*`` variables, as a new user (or CI) has them. Ray's local head
then needs a token that nothing has made yet; the script must make it, keep it where Ray reads it
and never print it."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from optw.raylocal import default_token_path, ensure_token, token_source
from test_quiet_output import ray_running, run_embedded, tiny_job


def fresh_env(base: dict, home: Path, ray_tmp: Path) -> dict:
    """``base`` with an empty home folder, its own Ray temp folder, no Ray token variables."""
    home.mkdir()
    ray_tmp.mkdir()
    env = {**base, "HOME": str(home), "RAY_TMPDIR": str(ray_tmp)}
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "XDG_CONFIG_HOME",
                "XDG_CACHE_HOME", "MPLCONFIGDIR"):
        env.pop(var, None)
    return env


def test_embedded_job_runs_with_an_empty_home(tmp_path):
    """The first README command on a fresh machine: embedded.sh starts its Ray head (it fails
    with "no authentication token was found" when nothing makes one), the tiny job succeeds and
    prints its summary; the token is in ~/.ray/auth_token of the new home, readable by its owner
    only, named once in the output and never printed itself."""
    env, args = tiny_job(tmp_path, "fresh-home")
    if ray_running(env):
        pytest.skip("a Ray cluster is already running here; its ports are taken")
    env = fresh_env(env, tmp_path / "home", Path(f"/tmp/optw-fresh-{os.getpid()}"))
    try:
        out = run_embedded(tmp_path, env, args)
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert "job fresh-home: 3 model(s) trained" in out, out[-4000:]
    token_file = tmp_path / "home" / ".ray" / "auth_token"
    token = token_file.read_text().strip()
    assert token and token not in out
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert out.count(f"created the token of local Ray clusters in {token_file}") == 1, out[:2000]


def test_an_existing_token_is_reused_never_replaced(tmp_path, monkeypatch):
    """ensure_token keeps a token that exists (the file, or RAY_AUTH_TOKEN), makes one only
    when there is none, says so once, and makes nothing when auth is disabled."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    said: list[str] = []
    assert token_source() is None
    where = ensure_token(said.append)
    assert where == str(default_token_path()) == str(tmp_path / ".ray" / "auth_token")
    first = default_token_path().read_text()
    assert len(said) == 1 and first not in said[0]
    assert ensure_token(said.append) == where and default_token_path().read_text() == first
    assert len(said) == 1  # nothing more to say
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-the-environment")
    assert ensure_token(said.append) == "$RAY_AUTH_TOKEN"
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "elsewhere" / "token"))
    assert ensure_token(said.append) == str(tmp_path / "elsewhere" / "token")
    assert (tmp_path / "elsewhere" / "token").read_text() != first
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    default_token_path().unlink()
    assert ensure_token(said.append) is None and not default_token_path().exists()
