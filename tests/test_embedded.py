"""`make run`'s script (``jobs/embedded.sh``) run once, as a new user runs it, and checked from
three sides: a fresh machine (empty home, its own Ray temp folder, no ``RAY_AUTH_*``), quiet
output (the job's lines, not Ray's internals), and the Ray dashboard (the job listed, our
gauges exported while it trains).

One run serves the three tests (it takes minutes on a 2-core machine): the fixture starts it
with ``KEEP_RAY=1``, scrapes the gauges while it trains, and stops the Ray head it leaves once
the module's tests are done."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import stat
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chromium import DevTools, find_chromium, page_target, start_chromium
from conftest import stop_process
from test_fresh_machine import fresh_env
from test_quiet_output import RAY_INTERNALS, ROOT, ray_running, stop_ray, tiny_job

DASHBOARD = "http://127.0.0.1:8265"
#: the gauges RayReport sets in a training worker, as Ray's metrics agent exports them
GAUGES = {f"ray_optw_{g}" for g in ("epochs_per_s", "mean_reward", "val_score", "val_gap_ils")}
TOKEN_COOKIE = "ray-authentication-token"
NAME = "embedded"


@dataclass
class EmbeddedRun:
    """What one `KEEP_RAY=1 jobs/embedded.sh` run left: its output and exit status, the
    fresh home and Ray temp folder it ran with, and the gauges scraped while it trained."""

    out: str
    returncode: int
    home: Path
    ray_tmp: Path
    tmp_path: Path
    gauges: dict[str, set] = field(default_factory=dict)

    @property
    def logs(self) -> Path:
        """Ray's log folder of the run (the one embedded.sh names)."""
        return self.ray_tmp / "ray" / "session_latest" / "logs"

    @property
    def token_file(self) -> Path:
        return self.home / ".ray" / "auth_token"

    def job_id(self) -> str:
        return re.search(r"job (optw-\S+) submitted", self.out).group(1)

    def check(self) -> None:
        assert self.returncode == 0, self.out[-4000:]


def scrape_optw_gauges(discovery: Path) -> dict[str, set[tuple[str, str]]]:
    """Our gauges on the metrics export endpoints of the cluster's nodes (listed in Ray's
    Prometheus service-discovery file): name -> the (stage, region) pairs seen."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, set[tuple[str, str]]] = {}
    try:
        groups = json.loads(discovery.read_text())
    except (OSError, ValueError):
        return found
    for target in {t for g in groups for t in g.get("targets", [])}:
        try:
            with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            continue
        for fam in text_string_to_metric_families(text):
            if fam.name in GAUGES:
                found.setdefault(fam.name, set()).update(
                    (s.labels.get("stage", ""), s.labels.get("region", ""))
                    for s in fam.samples)
    return found


@pytest.fixture(scope="module")
def embedded(tmp_path_factory) -> EmbeddedRun:
    """One tiny job through `KEEP_RAY=1 jobs/embedded.sh` on a fresh home (three tiny regions,
    its own catalog, MLflow store and output folder); the gauges are scraped every second while
    it runs. The Ray head it leaves is stopped after the module."""
    tmp_path = tmp_path_factory.mktemp("embedded")
    env, args = tiny_job(tmp_path, NAME)
    if ray_running(env):
        pytest.skip("a Ray cluster is already running here; its ports are taken")
    ray_tmp = Path(f"/tmp/optw-fresh-{os.getpid()}")  # short: Ray's socket paths have a limit
    shutil.rmtree(ray_tmp, ignore_errors=True)
    env = fresh_env(env, tmp_path / "home", ray_tmp)
    env["KEEP_RAY"] = "1"
    discovery = ray_tmp / "ray" / "prom_metrics_service_discovery.json"
    log = tmp_path / "output.txt"
    gauges: dict[str, set] = {}
    try:
        with log.open("w") as sink:
            job = subprocess.Popen(["bash", str(ROOT / "jobs" / "embedded.sh"), *args],
                                   env=env, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                   text=True)
        t0 = time.monotonic()
        while job.poll() is None and time.monotonic() < t0 + 600:
            for name, models in scrape_optw_gauges(discovery).items():
                gauges.setdefault(name, set()).update(models)
            time.sleep(1)
        if job.poll() is None:
            stop_process(job)
        for name, models in scrape_optw_gauges(discovery).items():
            gauges.setdefault(name, set()).update(models)
        yield EmbeddedRun(log.read_text(), job.returncode, tmp_path / "home", ray_tmp,
                          tmp_path, gauges)
    finally:
        stop_ray(env)
        shutil.rmtree(ray_tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- fresh machine


def test_embedded_job_runs_with_an_empty_home(embedded):
    """The first README command on a fresh machine: embedded.sh starts its Ray head (it fails
    with "no authentication token was found" when nothing makes one), the tiny job succeeds and
    prints its summary; the token is in ~/.ray/auth_token of the new home, readable by its owner
    only, named once in the output and never printed itself."""
    embedded.check()
    out = embedded.out
    assert f"job {NAME}: 3 model(s) trained" in out, out[-4000:]
    token = embedded.token_file.read_text().strip()
    assert token and token not in out
    assert stat.S_IMODE(embedded.token_file.stat().st_mode) == 0o600
    assert out.count(f"created the token of local Ray clusters in {embedded.token_file}") == 1, \
        out[:2000]


# ----------------------------------------------------------------------------- quiet output


def test_embedded_job_output_is_ours_not_rays(embedded):
    """The output holds the job's own lines (its start line, stage progress, summary table,
    where to look, what became of the Ray head) and none of Ray's internals (RAY_INTERNALS);
    those are in Ray's log folder, which the output names: the job's whole output, Ray
    Train's report lines."""
    embedded.check()
    out, logs = embedded.out, embedded.logs
    for line in (r"starting a local Ray head",
                 rf"job optw-\S+ submitted; Ray's logs: {re.escape(str(logs))}",
                 rf"job {NAME}: mode scratch, 3 regions, 3 models, \d+ at a time",
                 r"stage scratch: 100%",
                 rf"job {NAME}: 3 model\(s\) trained, 0 region\(s\) skipped",
                 r"solomon +validation +model_greedy",
                 r"time: [\d.]+ min wall",
                 rf"results: {re.escape(str(embedded.tmp_path))}/out/results.parquet",
                 rf"MLflow: parent run \w+ in experiment '{NAME}'",
                 r"done in \d+ s\.",
                 # where to look: the store the job was given (--tracking-uri), not the default
                 rf"MLflow UI: +\S+ ui --backend-store-uri "
                 rf"{re.escape(f'sqlite:///{embedded.tmp_path}/mlflow.db')}$",
                 r"leaving the local Ray head running \(KEEP_RAY=1\); stop it with: "):
        assert re.search(line, out, re.M), f"missing {line!r} in:\n{out}"
    for kind, pattern in RAY_INTERNALS.items():
        hits = [x for x in out.splitlines() if re.search(pattern, x)]
        assert not hits, f"{kind} in the output: {hits[:3]}"
    driver = logs / f"job-driver-{embedded.job_id()}.log"
    assert f"job {NAME}: 3 model(s) trained" in driver.read_text()
    train_logs = "".join(p.read_text(errors="replace") for p in (logs / "train").glob("*"))
    assert "Reporting training result" in train_logs
    raylet = (logs / "raylet.out").read_text(errors="replace")
    print(f"raylet worker-start warnings in raylet.out: "
          f"{raylet.count('PYTHON worker processes have been started')}")


# ----------------------------------------------------------------------------- Ray dashboard


def api(path: str, token: str | None) -> tuple[int, str]:
    req = urllib.request.Request(DASHBOARD + path)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def page_text(devtools: DevTools) -> str:
    res = devtools.call("Runtime.evaluate", expression="document.body.innerText",
                        returnByValue=True)
    return res.get("result", {}).get("value") or ""


def wait_for_text(devtools: DevTools, pattern: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = page_text(devtools)
        if re.search(pattern, text):
            return text
        time.sleep(1)
    raise AssertionError(f"{pattern!r} not on the page within {timeout:.0f} s:\n{text[:3000]}")


def test_ray_dashboard_shows_the_job_and_our_metrics(embedded, tmp_path, output_dir):
    """While the job trains, the node's metrics export port (listed in Ray's Prometheus
    service-discovery file) serves our four `ray_optw_*` gauges with their stage/region labels.
    The head stays up (KEEP_RAY=1): the dashboard's API refuses requests without the token
    (401) and lists the job as SUCCEEDED with it. In headless Chromium, with the token as the
    dashboard's `ray-authentication-token` cookie, the Jobs page lists the job by its
    submission id and its page shows it succeeded, with its entrypoint; screenshots:
    test-output/ray-dashboard.png (Jobs page), ray-dashboard-job.png (the job's page)."""
    embedded.check()
    gauges = embedded.gauges
    assert set(gauges) == GAUGES, f"gauges seen: {gauges}"
    assert ("scratch", "r199") in gauges["ray_optw_mean_reward"], gauges
    # -- the job, through the dashboard's API (token auth)
    job_id = embedded.job_id()
    token = embedded.token_file.read_text().strip()
    status, body = api("/api/jobs/", None)
    assert status == 401, (status, body[:300])
    status, body = api("/api/jobs/", token)
    assert status == 200, (status, body[:300])
    jobs = {j.get("submission_id"): j for j in json.loads(body)}
    assert jobs[job_id]["status"] == "SUCCEEDED", jobs[job_id]
    # -- the dashboard in a browser
    binary = find_chromium()
    if binary is None:
        pytest.skip("chromium not found (make browser installs it)")
    from websockets.sync.client import connect

    chromium, port = start_chromium(binary, tmp_path / "chromium-profile")
    try:
        with connect(page_target(port), max_size=None, open_timeout=20) as ws:
            devtools = DevTools(ws)
            for domain in ("Page", "Runtime", "Network"):
                devtools.call(f"{domain}.enable")
            assert devtools.call("Network.setCookie", name=TOKEN_COOKIE, value=token,
                                 url=DASHBOARD + "/")["success"]
            devtools.call("Emulation.setDeviceMetricsOverride", width=1400, height=900,
                          deviceScaleFactor=1, mobile=False)
            devtools.call("Page.navigate", url=f"{DASHBOARD}/#/jobs")
            text = wait_for_text(devtools, re.escape(job_id))
            assert "SUCCEEDED" in text, text[:3000]
            shot = devtools.call("Page.captureScreenshot", format="png", timeout=60)
            png = base64.b64decode(shot["data"])
            assert png.startswith(b"\x89PNG") and len(png) > 10_000
            (output_dir / "ray-dashboard.png").write_bytes(png)
            # the job's own page: its status, submission id and entrypoint
            devtools.call("Page.navigate", url=f"{DASHBOARD}/#/jobs/{job_id}")
            text = wait_for_text(devtools, rf"Submission ID\s+{re.escape(job_id)}")
            assert re.search(r"Status\s+SUCCEEDED", text), text[:3000]
            assert "python jobs/train_all.py --profile" in text, text[:3000]
            shot = devtools.call("Page.captureScreenshot", format="png", timeout=60)
            (output_dir / "ray-dashboard-job.png").write_bytes(base64.b64decode(shot["data"]))
    finally:
        stop_process(chromium)
