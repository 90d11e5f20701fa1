"""The Grafana dashboard in ``dashboards/``: its JSON, and (real Ray) that the metrics it
queries are the names Ray exports for the training gauges."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import local_ray, stop_process

DASHBOARD = Path(__file__).resolve().parents[1] / "dashboards" / "optw_training.json"
#: The gauges RayReport sets (``optw_<name>``), as Ray exports them to Prometheus.
GAUGES = ("epochs_per_s", "mean_reward", "val_score", "val_gap_ils")
RAY_PREFIX = "ray_"
EXPORTED = {f"{RAY_PREFIX}optw_{g}" for g in GAUGES}
TAGS = {"region": "r199", "stage": "scratch"}
_METRIC = re.compile(r"\bray_optw_\w+")


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out += [p, *p.get("panels", [])] if p.get("type") == "row" else [p]
    return [p for p in out if p.get("type") != "row"]


def test_dashboard_json_queries_the_exported_metrics(dashboard):
    """Valid Grafana JSON in Ray's form (uid, schema, `${datasource}` Prometheus variable);
    every panel queries exactly one exported `ray_optw_*` gauge filtered by the region and
    stage variables; all four gauges have a panel; panel ids are unique."""
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 27
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    for name in ("region", "stage"):
        var = variables[name]
        assert var["type"] == "query" and var["multi"] and var["includeAll"]
        assert var["datasource"] == "${datasource}"
        assert re.fullmatch(rf"label_values\(ray_optw_\w+(\{{.*\}})?, {name}\)",
                            var["query"]["query"])
        assert _METRIC.search(var["query"]["query"]).group(0) in EXPORTED
    panels = _panels(dashboard)
    assert len({p["id"] for p in panels}) == len(panels)
    seen = set()
    for p in panels:
        assert p["datasource"] == "${datasource}" and p["targets"], p["title"]
        assert {"x", "y", "w", "h"} <= set(p["gridPos"])
        for t in p["targets"]:
            names = set(_METRIC.findall(t["expr"]))
            assert len(names) == 1 and names <= EXPORTED, t["expr"]
            assert 'region=~"$region"' in t["expr"] and 'stage=~"$stage"' in t["expr"]
            seen |= names
    assert seen == EXPORTED


@pytest.fixture(scope="module")
def ray_metrics():
    """A local Ray where an actor has set RayReport's gauges for model (r199, scratch), as a
    training worker does; yields the metrics export URL of the actor's node."""
    with local_ray(num_cpus=1, object_store_mb=100) as ray:
        yield from _report_metrics(ray)


def _report_metrics(ray):
    """The body of :func:`ray_metrics` on a running Ray."""

    @ray.remote(num_cpus=0)
    class Worker:
        def report(self) -> str:
            from optw.distributed.ray_train import RayReport
            from optw.train.callbacks import TrainContext

            # epoch == total_epochs: no ray.train.report (no Train session here)
            ctx = TrainContext(region_ids=["r199"], config=None, epoch=4, total_epochs=4)
            cb = RayReport(every=1, checkpoint_every=0, tags=TAGS, ils_means={"r199": 50.0})
            cb.on_epoch_end(ctx, {"epochs_per_s": 12.5, "mean_reward": 30.0})
            cb.on_validation(ctx, {"val_score": 40.0})
            return ray.get_runtime_context().get_node_id()

    worker = Worker.remote()
    try:
        node_id = ray.get(worker.report.remote(), timeout=60)
        node = next(n for n in ray.nodes() if n["NodeID"] == node_id)
        yield f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    finally:
        ray.kill(worker)


def test_ray_report_exports_the_names_the_dashboard_queries(dashboard, ray_metrics):
    """On a real local Ray, RayReport's gauges (set inside an actor, as in a training worker)
    appear on the node's metrics export endpoint under the names, and with the labels
    (region, stage, SessionName), that the dashboard's queries and variables use."""
    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + 45  # Ray exports every ~10 s
    samples: dict[str, list] = {}
    while time.monotonic() < deadline:
        with urllib.request.urlopen(ray_metrics, timeout=10) as resp:
            text = resp.read().decode()
        samples = {}
        for fam in text_string_to_metric_families(text):
            if fam.name in EXPORTED:
                samples[fam.name] = [s for s in fam.samples
                                     if all(s.labels.get(k) == v for k, v in TAGS.items())]
        if all(samples.get(m) for m in EXPORTED):
            break
        time.sleep(2)
    missing = sorted(m for m in EXPORTED if not samples.get(m))
    assert not missing, f"not exported within 45 s from {ray_metrics}: {missing}"
    assert samples["ray_optw_val_gap_ils"][0].value == pytest.approx(20.0)
    assert samples["ray_optw_epochs_per_s"][0].value == pytest.approx(12.5)
    for m in EXPORTED:
        assert samples[m][0].labels.get("SessionName"), samples[m][0].labels
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            metric, label = re.fullmatch(r"label_values\((\w+).*, (\w+)\)",
                                         var["query"]["query"]).groups()
            assert label in samples[metric][0].labels


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_panel_queries_in_a_real_prometheus(dashboard, ray_metrics, tmp_path):
    """With a real Prometheus (Debian's `prometheus`, which `make test` installs; skipped
    when absent) scraping the Ray node, every panel's PromQL (variables set to "All") is valid
    and returns the series of model (r199, scratch)."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not installed (`make prometheus`, as root: apt-get install -y "
                    "--no-install-recommends prometheus)")
    target = ray_metrics.split("//", 1)[1].split("/", 1)[0]
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 2s\nscrape_configs:\n- job_name: ray\n"
        f"  static_configs:\n  - targets: ['{target}']\n")
    port = _free_port()
    proc = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def query(expr: str) -> dict:
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.load(resp)

    try:
        exprs = [t["expr"] for p in _panels(dashboard) for t in p["targets"]]
        for name in ("$SessionName", "$region", "$stage"):
            exprs = [e.replace(name, ".*") for e in exprs]
        deadline = time.monotonic() + 45
        results: dict[str, list] = {}
        while time.monotonic() < deadline:
            try:
                results = {e: query(e)["data"]["result"] for e in exprs}
            except OSError:  # not listening yet
                results = {}
            if results and all(results.values()):
                break
            time.sleep(1)
        for expr, res in results.items():
            assert {tuple(sorted(r["metric"].items())) for r in res} >= \
                {tuple(sorted(TAGS.items()))}, expr
        assert results and all(results.values()), results
    finally:
        stop_process(proc)
