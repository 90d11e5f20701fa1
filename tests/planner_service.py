"""The trip planner as the tests drive it: a planner serving untrained champions over a real
Ray Serve and MLflow store (:func:`serve_champions`), HTTP helpers, and the checks of an answer
(route, schedule, travel legs) against the independent route validator; shared by the planner,
planner-page and custom-job tests."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optw.catalog import Catalog, Region, Tourists
from optw.env import check_route
from optw.serve import format_time, preference_scores

#: A made-up city: the start place first (its hours are the day), then the POIs.
CITY_CSV = """name,lat,lon,visit_minutes,opens,closes,score
Hotel Central,38.7100,-9.1400,0,08:00,20:00,0
Castle Hill,38.7139,-9.1334,75,09:00,17:30,9
Old Cathedral,38.7098,-9.1335,30,09:30,18:00,6
River Square,38.7075,-9.1365,20,08:00,19:00,4
Tile Museum,38.7247,-9.1136,60,10:00,17:00,7
Botanic Garden,38.7180,-9.1500,45,09:00,18:00,5
Viewpoint São Pedro,38.7153,-9.1446,15,08:00,19:30,3
Market Hall,38.7068,-9.1459,40,08:00,14:00,5
Tram Museum,38.7035,-9.1700,50,10:00,16:30,4
Monastery,38.6979,-9.2063,90,10:00,17:00,10
"""


@dataclass
class Service:
    """A running planner: its URL, tracking store, catalog and temporary folder."""

    url: str
    uri: str
    catalog: Catalog
    root: Path


def post_json(url: str, body: bytes | dict[str, Any], timeout: float = 60) -> tuple[int, dict]:
    """POST ``body`` as JSON; the status and the decoded answer (of an HTTP error too)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def get_json(url: str) -> tuple[int, Any]:
    """GET ``url``; the status and the decoded answer (of an HTTP error too)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def register_untrained(region, root: Path, seed: int, val_score: float, uri: str) -> int:
    """Register an untrained network (weights of ``seed``) for ``region``; its version."""
    import torch

    from optw.model import ModelConfig, PointerNet, save_model
    from optw.tracking import register_version, start_job_run

    torch.manual_seed(seed)
    ckpt = save_model(PointerNet(ModelConfig()), root / f"{region.id}-{seed}.pt")
    run_id = start_job_run("planner-tests", {"seed": seed}, uri=uri).child("train", region.id)
    return register_version(region.id, ckpt, run_id, {"val_score": val_score}, uri=uri,
                            region_data=region)


def serve_champions(catalog, regions, root: Path, check_interval: float):
    """The planner on a free loopback port over ``catalog``, with an untrained champion for
    each of ``regions`` in a sqlite registry under ``root`` (a generator: the body of a
    fixture; the planner stops when it resumes)."""
    from optw.serve import start_planner, stop_planner
    from optw.tracking import get_client
    from optw.tracking.server import free_port

    uri = f"sqlite:///{root / 'mlflow.db'}"
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", uri)  # set before Ray starts: workers inherit it too
    get_client(uri)
    for i, rid in enumerate(regions):
        register_untrained(catalog.region(rid), root, seed=i, val_score=1.0, uri=uri)
    try:
        url = start_planner(port=free_port(), catalog=catalog.path, tracking_uri=uri,
                            check_interval=check_interval, ray_cpus=2)
        yield Service(url, uri, catalog, root)
    finally:
        stop_planner()
        mp.undo()


def first_plan(url: str, body: dict[str, Any]) -> tuple[int, dict]:
    """POST the first plan of a region to a fresh deployment: it may get 503 while the model
    loads (longer than the registry timeout on a busy machine); the load goes on in the
    background and serves a later request, so retry on 503 (a hang guard of 300 s)."""
    deadline = time.monotonic() + 300
    while True:
        status, ans = post_json(url, body, 120)
        if status != 503 or time.monotonic() > deadline:
            return status, ans
        time.sleep(0.5)


def check_answer(svc: Service, body: dict[str, Any], ans: dict[str, Any]) -> None:
    """The answer's route is feasible for the request's tourist, its score and schedule are the
    validator's, and its times are consistent (arrive <= start <= leave, travel times)."""
    region = svc.catalog.region(body["region"])
    n = region.n_nodes
    scores = np.zeros(n)
    if "scores" in body:
        scores[1:-1] = body["scores"]
    else:
        scores[1:-1] = preference_scores(region, body.get("preference", "balanced"))
    start = (ans["start"]["x"], ans["start"]["y"])
    tourist = Tourists(region.id, np.zeros(1, dtype=np.int64), "generated",
                       np.array([start]), np.array([ans["t_start"]]), np.array([ans["t_end"]]),
                       scores[None])
    nodes = [s["node"] for s in ans["route"]]
    check = check_route(region, nodes, tourist, 0, claimed_score=ans["score"])
    assert check.ok, check.problems
    assert nodes[0] == 0 and nodes[-1] == n - 1 and ans["visits"] == len(nodes) - 2
    assert [s["arrival"] for s in ans["route"]] == pytest.approx(check.arrival)
    assert [s["start"] for s in ans["route"]] == pytest.approx(check.start)
    assert [s["leave"] for s in ans["route"]] == pytest.approx(check.leave)
    dist = region.distances(np.array([start]))[0]
    for prev, s in zip(ans["route"], ans["route"][1:], strict=False):
        assert prev["leave"] + dist[prev["node"], s["node"]] == pytest.approx(s["arrival"])
        assert s["arrival"] <= s["start"] + 1e-9 and s["start"] <= s["leave"] + 1e-9
        if s["kind"] == "visit":
            assert s["start"] >= region.opening[s["node"]] - 1e-9
            assert s["leave"] == pytest.approx(s["start"] + region.duration[s["node"]])
            assert (s["x"], s["y"]) == (region.x[s["node"]], region.y[s["node"]])
    assert ans["route"][0]["x"] == ans["route"][-1]["x"] == start[0]
    assert ans["route"][-1]["arrival"] <= ans["t_end"] + 1e-9
    assert sum(s["score"] for s in ans["route"]) == pytest.approx(ans["score"])
    # names, clock times and travel legs (benchmark regions have no names: "POI <node>")
    assert ans["coords"] == "xy" and ans["t_start_clock"] == format_time(ans["t_start"])
    for s in ans["route"]:
        assert s["name"] == (f"POI {s['node']}" if s["kind"] == "visit" else s["kind"])
        assert all(s[f"{k}_clock"] == format_time(s[k]) for k in ("arrival", "start", "leave"))
    assert len(ans["legs"]) == len(nodes) - 1
    for leg, a, b in zip(ans["legs"], ans["route"], ans["route"][1:], strict=False):
        assert (leg["from_node"], leg["to_node"], leg["depart"], leg["arrive"]) == (
            a["node"], b["node"], a["leave"], b["arrival"])
        assert leg["travel"] == pytest.approx(dist[a["node"], b["node"]], abs=1e-6)


def validate_answer(region: Region, ans: dict[str, Any]) -> None:
    """The answer's route passes the independent validator with the answer's start, times and
    scores, and its schedule is the validator's."""
    scores = np.zeros(region.n_nodes)
    for s in ans["route"]:
        scores[s["node"]] = s["score"]
    tourist = Tourists(region.id, np.zeros(1, dtype=np.int64), "generated",
                       np.array([[ans["start"]["x"], ans["start"]["y"]]]),
                       np.array([ans["t_start"]]), np.array([ans["t_end"]]), scores[None])
    nodes = [s["node"] for s in ans["route"]]
    check = check_route(region, nodes, tourist, 0, claimed_score=ans["score"])
    assert check.ok, check.problems
    assert [s["arrival"] for s in ans["route"]] == pytest.approx(check.arrival)
    assert [s["leave"] for s in ans["route"]] == pytest.approx(check.leave)


def check_legs(region: Region, ans: dict[str, Any]) -> None:
    """One leg per pair of consecutive stops: leave one, travel the region's travel time for
    this start, arrive at the next; clock strings are the minutes as HH:MM."""
    route, legs = ans["route"], ans["legs"]
    assert len(legs) == len(route) - 1
    dist = region.distances(np.array([[ans["start"]["x"], ans["start"]["y"]]]))[0]
    for leg, a, b in zip(legs, route, route[1:], strict=False):
        assert (leg["from"], leg["to"]) == (a["stop"], b["stop"])
        assert (leg["from_node"], leg["to_node"]) == (a["node"], b["node"])
        assert (leg["from_name"], leg["to_name"]) == (a["name"], b["name"])
        assert leg["depart"] == a["leave"] and leg["arrive"] == b["arrival"]
        assert leg["travel"] == pytest.approx(dist[a["node"], b["node"]], abs=1e-6)
        assert leg["depart_clock"] == format_time(a["leave"])
        assert leg["arrive_clock"] == format_time(b["arrival"])
    for s in route:
        for key in ("arrival", "start", "leave"):
            assert s[f"{key}_clock"] == format_time(s[key])
        assert s["wait"] == pytest.approx(s["start"] - s["arrival"], abs=0.01)
