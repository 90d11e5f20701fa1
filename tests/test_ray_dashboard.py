"""The Ray dashboard of a job run the way `make run` runs it (`KEEP_RAY=1 jobs/embedded.sh`):
opened in headless Chromium with the cluster's token, it lists the job; our training gauges
(``ray_optw_*``) are exported on the node's metrics port while it trains; a screenshot goes to
``test-output/ray-dashboard.png``."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import stop_process
from optw.raylocal import default_token_path, temp_dir
from test_quiet_output import ROOT, ray_running, stop_ray, tiny_job
from test_report import DevTools, find_chromium, page_target, start_chromium

DASHBOARD = "http://127.0.0.1:8265"
#: the gauges RayReport sets in a training worker, as Ray's metrics agent exports them
GAUGES = {f"ray_optw_{g}" for g in ("epochs_per_s", "mean_reward", "val_score", "val_gap_ils")}
#: Ray's head lists every node's metrics export address here (Prometheus file discovery)
SERVICE_DISCOVERY = temp_dir() / "prom_metrics_service_discovery.json"
TOKEN_COOKIE = "ray-authentication-token"


def auth_token() -> str:
    """The local cluster's token (`RAY_AUTH_MODE=token`): ``ray get-auth-token`` prints it;
    ``jobs/embedded.sh`` keeps it in ~/.ray/auth_token (made there when missing)."""
    return default_token_path().read_text().strip()


def scrape_optw_gauges() -> dict[str, set[tuple[str, str]]]:
    """Our gauges on the metrics export endpoints of the cluster's nodes: name -> the
    (stage, region) pairs seen."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, set[tuple[str, str]]] = {}
    try:
        groups = json.loads(SERVICE_DISCOVERY.read_text())
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


def test_ray_dashboard_shows_the_job_and_our_metrics(tmp_path, output_dir):
    """`KEEP_RAY=1 jobs/embedded.sh` runs a tiny job and leaves the head up. While it trains,
    the node's metrics export port (listed in Ray's Prometheus service-discovery file) serves
    our four `ray_optw_*` gauges with their stage/region labels. The dashboard's API refuses
    requests without the token (401) and lists the job as SUCCEEDED with it. In headless
    Chromium, with the token as the dashboard's `ray-authentication-token` cookie, the Jobs page
    lists the job by its submission id and its page shows it succeeded, with its entrypoint;
    screenshots: test-output/ray-dashboard.png (Jobs page), ray-dashboard-job.png (the job's
    page). Ray is stopped at the end."""
    binary = find_chromium()
    if binary is None:
        pytest.skip("chromium not found (make browser installs it)")
    env, args = tiny_job(tmp_path, "ray-dashboard", regions=("r199", "pr99"))
    if ray_running(env):
        pytest.skip("a Ray cluster is already running here; embedded.sh would join it")
    env["KEEP_RAY"] = "1"
    SERVICE_DISCOVERY.unlink(missing_ok=True)  # an earlier cluster's
    log = tmp_path / "embedded.log"
    chromium = None
    try:
        with log.open("w") as sink:
            job = subprocess.Popen(["bash", str(ROOT / "jobs" / "embedded.sh"), *args],
                                   env=env, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                   text=True)
        # -- our custom metrics, while the job trains
        gauges: dict[str, set] = {}
        seen: dict[str, list[float]] = {}  # gauge -> first and last time seen (s from start)
        t0 = time.monotonic()
        while job.poll() is None and time.monotonic() < t0 + 600:
            for name, models in scrape_optw_gauges().items():
                gauges.setdefault(name, set()).update(models)
                seen.setdefault(name, [time.monotonic() - t0])[1:] = [time.monotonic() - t0]
            time.sleep(1)
        print("gauges seen (s from the start, first and last):",
              {k: [round(t) for t in v] for k, v in sorted(seen.items())})
        for name, models in scrape_optw_gauges().items():
            gauges.setdefault(name, set()).update(models)
        if job.poll() is None:
            stop_process(job)
        out = log.read_text()
        assert job.returncode == 0, out[-4000:]
        assert set(gauges) == GAUGES, f"gauges seen: {gauges}"
        assert ("scratch", "r199") in gauges["ray_optw_mean_reward"], gauges
        # -- the job, through the dashboard's API (token auth)
        job_id = re.search(r"job (optw-\S+) submitted", out).group(1)
        token = auth_token()
        status, body = api("/api/jobs/", None)
        assert status == 401, (status, body[:300])
        status, body = api("/api/jobs/", token)
        assert status == 200, (status, body[:300])
        jobs = {j.get("submission_id"): j for j in json.loads(body)}
        assert jobs[job_id]["status"] == "SUCCEEDED", jobs[job_id]
        # -- the dashboard in a browser
        from websockets.sync.client import connect

        chromium, port = start_chromium(binary, tmp_path / "chromium-profile")
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
        if chromium is not None:
            stop_process(chromium)
        stop_ray(env)
