"""A fresh machine: `make run`'s script (``jobs/embedded.sh``) with an empty home folder, its own
Ray temp folder and no ``RAY_AUTH_*`` variables, as a new user (or CI) has them. Ray's local head
then needs a token that nothing has made yet; the script must make it, keep it where Ray reads it
and never print it. The script's run on a fresh home is in test_embedded.py; here: the token's
rules."""

from __future__ import annotations

from pathlib import Path

from optw.raylocal import default_token_path, ensure_token, token_source


def fresh_env(base: dict, home: Path, ray_tmp: Path) -> dict:
    """``base`` with an empty home folder, its own Ray temp folder, no Ray token variables."""
    home.mkdir()
    ray_tmp.mkdir()
    env = {**base, "HOME": str(home), "RAY_TMPDIR": str(ray_tmp)}
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "XDG_CONFIG_HOME",
                "XDG_CACHE_HOME", "MPLCONFIGDIR"):
        env.pop(var, None)
    return env


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
