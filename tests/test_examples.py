"""README's worked examples run as written.

"Your own region": the shell commands between ``<!-- your-region:begin -->`` and
``<!-- your-region:end -->`` in README.md are parsed out of the file (so README and test cannot
drift) and run one after another in the project root, against a private copy of the built
catalog (``OPTW_CATALOG``), a temporary MLflow store (``MLFLOW_TRACKING_URI``) and temporary
run folders (``OPTW_STORAGE``). A command ending in ``&`` (``optw serve``) runs in the
background until the planner answers ``GET /healthz``; the port is the one change made to the
commands (a free port instead of README's 8000, so a planner already running elsewhere on this
machine does not answer instead). Every command must exit 0, and each output has the shape
README shows.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import copy_catalog, stop_process

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- your-region:begin -->", "<!-- your-region:end -->"


def readme_commands(text: str) -> list[str]:
    """The shell commands of the README's "Your own region" block: the fenced ``bash`` code
    between the markers, ``\\``-continued lines joined, comment lines (``# ...``) dropped
    (the block has no comments after a command)."""
    start, end = text.index(BEGIN), text.index(END)
    block = text[start:end]
    code = re.findall(r"```bash\n(.*?)```", block, flags=re.S)
    assert code, "no ```bash block between the README markers"
    commands, current = [], ""
    for line in "\n".join(code).splitlines():
        line = line.rstrip()
        if not current and (not line or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        commands.append(current.strip())
        current = ""
    return commands


def test_readme_block_parses():
    """The README block holds the whole path: add, train, plan, serve (and a request)."""
    commands = readme_commands((ROOT / "README.md").read_text())
    words = [c.split()[:2] for c in commands]
    assert ["optw", "catalog"] in words and ["optw", "job"] in words
    assert ["optw", "plan"] in words and ["optw", "serve"] in words
    assert any(c.endswith("&") for c in commands)


def _healthy(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=5) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(1)
    return False


@pytest.mark.slow
def test_your_own_region_runs_as_written(catalog, tmp_path):
    """Every command of README's "Your own region" runs as written on a private catalog copy
    and store: the region is added, trained and registered by the job, planned from the shell
    (names and clock times), served, and planned over HTTP (a lat/lon answer with legs)."""
    from optw.tracking.server import free_port

    copy_catalog(catalog, tmp_path / "catalog")
    port = str(free_port())
    env = {**os.environ, "OPTW_CATALOG": str(tmp_path / "catalog"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
           "OPTW_STORAGE": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    commands = [c.replace("8000", port) for c in readme_commands((ROOT / "README.md").read_text())]
    outputs: dict[str, str] = {}
    server = None
    try:
        for command in commands:
            if command.endswith("&"):
                server = subprocess.Popen(command[:-1], shell=True, cwd=ROOT, env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                          start_new_session=True)
                assert _healthy(f"http://127.0.0.1:{port}", 180), f"{command}: never healthy"
                continue
            done = subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=1200)
            assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            outputs[" ".join(command.split()[:2])] = done.stdout
    finally:
        if server is not None:
            os.killpg(server.pid, 15)
            stop_process(server, timeout=60)
    assert "lucca" in outputs["optw catalog"]
    assert "registered" in outputs["optw job"] and "lucca" in outputs["optw job"]
    plan = outputs["optw plan"]
    assert re.search(r"\d\d:\d\d", plan) and "Trip in lucca" in plan
    answer = json.loads(outputs[next(k for k in outputs if k.startswith("curl"))])
    assert answer["region"] == "lucca" and answer["coords"] == "latlon" and answer["legs"]
    assert answer["route"][1]["name"] and answer["route"][1]["arrival_clock"]
