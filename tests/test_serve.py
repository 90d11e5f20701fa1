"""The trip planner for real: a local Ray with Serve on a free loopback port, a real MLflow
sqlite store in a temporary folder, untrained (random) models registered for the tiny regions
r199 and t199 (pr99 has no champion). One planner serves the whole module.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optw.catalog import Catalog, Tourists
from optw.env import check_route
from optw.serve import PREFERENCES, format_time, parse_time, preference_scores
from optw.serve.planner import MAX_BODY_BYTES, PlanError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SERVED = ("r199", "t199")  # regions with a champion; pr99 has none


@dataclass
class Service:
    url: str
    uri: str
    catalog: Catalog
    root: Path


def _post(url: str, body: bytes | dict[str, Any], timeout: float = 60) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _register(region, root: Path, seed: int, val_score: float, uri: str) -> int:
    import torch

    from optw.model import ModelConfig, PointerNet, save_model
    from optw.tracking import register_version, start_job_run

    torch.manual_seed(seed)
    ckpt = save_model(PointerNet(ModelConfig()), root / f"{region.id}-{seed}.pt")
    run_id = start_job_run("planner-tests", {"seed": seed}, uri=uri).child("train", region.id)
    return register_version(region.id, ckpt, run_id, {"val_score": val_score}, uri=uri,
                            region_data=region)


@pytest.fixture(scope="module")
def service(tmp_path_factory, tiny_catalog) -> Service:
    """The planner on a free loopback port, registry in a temporary sqlite store."""
    from optw.serve import start_planner, stop_planner
    from optw.tracking import get_client
    from optw.tracking.server import free_port

    root = tmp_path_factory.mktemp("planner")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", uri)  # set before Ray starts: workers inherit it too
    get_client(uri)
    for i, rid in enumerate(SERVED):
        _register(tiny_catalog.region(rid), root, seed=i, val_score=1.0, uri=uri)
    try:
        url = start_planner(port=free_port(), catalog=tiny_catalog.path, tracking_uri=uri,
                            check_interval=0.5, ray_cpus=2)
        yield Service(url, uri, tiny_catalog, root)
    finally:
        stop_planner()
        mp.undo()


def _champion(rid: str, uri: str) -> int:
    from optw.tracking import champion

    return champion(rid, uri=uri).version


def _check_answer(svc: Service, body: dict[str, Any], ans: dict[str, Any]) -> None:
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


# ----------------------------------------------------------------------------- no server


def test_times_parse_minutes_and_hhmm_and_format_back():
    """Times are minutes (numbers) or "HH:MM"; anything else names the field."""
    assert parse_time(540, "t_start") == (540.0, False)
    assert parse_time("09:30", "t_start") == (570.0, True)
    assert format_time(570) == "09:30" and format_time(1500) == "25:00"
    for bad in ("9h30", "09:60", "", True, None, float("nan")):
        with pytest.raises(PlanError, match="t_end") as err:
            parse_time(bad, "t_end")
        assert err.value.status == 422 and err.value.field == "t_end"


def test_preference_profiles_give_one_nonnegative_score_per_point(tiny_catalog):
    """Each named profile yields n_points finite scores >= 0; balanced = benchmark scores,
    uniform = all 1, long-visits grows with duration."""
    region = tiny_catalog.region("t199")
    for name in PREFERENCES:
        s = preference_scores(region, name)
        assert s.shape == (region.n_points,) and np.isfinite(s).all() and (s >= 0).all()
    np.testing.assert_array_equal(preference_scores(region, "balanced"), region.score[1:-1])
    assert (preference_scores(region, "uniform") == 1).all()
    d = region.duration[1:-1]
    long = preference_scores(region, "long-visits")
    assert long[d.argmax()] == long.max() and long[d.argmin()] == long.min()


def test_model_cache_checks_alias_at_most_every_interval(monkeypatch, tmp_path):
    """RegistryModels asks the registry at most once per check interval, loads a version only
    when the alias moved, keeps serving its cached model when the registry fails, and says 409
    for a region without a champion."""
    import types

    import optw.tracking as tracking
    from optw.serve import RegistryModels

    state = {"version": 1, "fail": False, "checks": 0, "loads": []}

    def champion(region, uri=None):
        state["checks"] += 1
        if state["fail"]:
            raise ConnectionError("registry down")
        return None if region == "none" else types.SimpleNamespace(version=state["version"])

    def load_solver(name, uri=None, dst_path=None):
        state["loads"].append(state["version"])
        return types.SimpleNamespace(model=f"m{state['version']}", version=state["version"])

    monkeypatch.setattr(tracking, "champion", champion)
    monkeypatch.setattr(tracking, "load_solver", load_solver)
    cache = RegistryModels("sqlite:///unused.db", check_interval=0.2, cache_dir=tmp_path)
    assert cache.get("r").model == "m1" and cache.get("r").model == "m1"
    assert state["checks"] == 1 and state["loads"] == [1]
    state["version"] = 2
    assert cache.get("r").version == 1  # within the interval: no registry query
    time.sleep(0.25)
    assert cache.get("r").version == 2 and state["loads"] == [1, 2]
    state["fail"] = True
    time.sleep(0.25)
    assert cache.get("r").version == 2  # registry down: the cached model keeps serving
    with pytest.raises(PlanError) as err:
        cache.get("other")
    assert err.value.status == 503
    state["fail"] = False
    with pytest.raises(PlanError) as err:
        cache.get("none")
    assert err.value.status == 409 and "champion" in err.value.message


# ----------------------------------------------------------------------------- service


def test_regions_and_healthz(service):
    """GET /regions lists every catalog region with its points; /regions/{id} the points
    themselves; /healthz answers ok."""
    status, regions = _get(f"{service.url}/regions")
    assert status == 200
    assert {r["region"]: r["points"] for r in regions} == {"r199": 10, "pr99": 14, "t199": 12}
    status, one = _get(f"{service.url}/regions/t199")
    assert status == 200 and len(one["points"]) == 12 and set(one["preferences"]) == set(
        PREFERENCES)
    assert _get(f"{service.url}/regions/nope")[0] == 404
    status, health = _get(f"{service.url}/healthz")
    assert status == 200 and health["status"] == "ok" and health["regions"] == 3


@pytest.mark.parametrize("method", ["greedy", "beam", "active-search"])
def test_plan_returns_valid_itinerary(service, method):
    """POST /plan answers a feasible route (checked with check_route) from start to end with
    the validator's schedule and score, and the champion's version, for every method."""
    for rid in SERVED:
        body = {"region": rid, "start": {"x": 20.0, "y": 30.0}, "method": method}
        if method == "beam":
            body["beams"] = 4
        status, ans = _post(f"{service.url}/plan", body)
        assert status == 200, ans
        assert ans["region"] == rid and ans["method"] == method
        assert ans["model_version"] == _champion(rid, service.uri)
        assert ans["solve_ms"] > 0
        _check_answer(service, body, ans)


def test_plan_with_clock_times_scores_and_preferences(service):
    """"HH:MM" times are minutes of the day; explicit scores and every preference profile give
    valid itineraries whose score is computed with those scores."""
    region = service.catalog.region("t199")
    base = {"region": "t199", "start": {"x": 50, "y": 50}, "t_start": "09:00",
            "t_end": "17:30"}
    status, ans = _post(f"{service.url}/plan", base)
    assert status == 200 and (ans["t_start"], ans["t_end"]) == (540.0, 1050.0) and ans["clock"]
    _check_answer(service, base, ans)
    for name in PREFERENCES:
        body = {**base, "preference": name}
        status, ans = _post(f"{service.url}/plan", body)
        assert status == 200 and ans["preference"] == name
        _check_answer(service, body, ans)
        if name == "uniform":
            assert ans["score"] == ans["visits"]
    scores = [float(i % 4) for i in range(region.n_points)]
    body = {**base, "scores": scores, "method": "beam", "beams": 8}
    status, ans = _post(f"{service.url}/plan", body)
    assert status == 200 and ans["preference"] is None
    _check_answer(service, body, ans)


def test_unreachable_tourist_gets_empty_itinerary(service):
    """A tourist who can reach no point (far away, or a one-minute day) gets [start, end] with
    score 0 and HTTP 200, not an error."""
    for body in ({"region": "r199", "start": {"x": 5000, "y": -5000}},
                 {"region": "t199", "t_start": 600, "t_end": 601, "method": "greedy"}):
        status, ans = _post(f"{service.url}/plan", body)
        assert status == 200, ans
        assert [s["kind"] for s in ans["route"]] == ["start", "end"]
        assert ans["score"] == 0 and ans["visits"] == 0
        _check_answer(service, body, ans)


BAD = [
    # (id, body, status, field)
    ("malformed-json", b'{"region": "r199",', 400, "body"),
    ("not-an-object", b"[1, 2]", 400, "body"),
    ("unknown-region", {"region": "c999"}, 404, "region"),
    ("region-not-string", {"region": 7}, 422, "region"),
    ("unknown-field", {"region": "r199", "beam": 4}, 422, "beam"),
    ("t_end-before-start", {"region": "r199", "t_start": 100, "t_end": 100}, 422, "t_end"),
    ("t_start-before-day", {"region": "r199", "t_start": -5}, 422, "t_start"),
    ("t_end-after-day", {"region": "t199", "t_end": "30:00"}, 422, "t_end"),
    ("bad-clock", {"region": "t199", "t_start": "9am"}, 422, "t_start"),
    ("nan-x", b'{"region": "r199", "start": {"x": NaN, "y": 1}}', 422, "start.x"),
    ("inf-y", b'{"region": "r199", "start": {"x": 1, "y": Infinity}}', 422, "start.y"),
    ("string-x", {"region": "r199", "start": {"x": "1", "y": 1}}, 422, "start.x"),
    ("start-shape", {"region": "r199", "start": [1, 2, 3]}, 422, "start"),
    ("few-scores", {"region": "r199", "scores": [1, 2, 3]}, 422, "scores"),
    ("nan-score", b'{"region": "r199", "scores": [1,1,1,1,NaN,1,1,1,1,1]}', 422, "scores[4]"),
    ("string-score", {"region": "r199", "scores": [1] * 9 + ["x"]}, 422, "scores[9]"),
    ("negative-score", {"region": "r199", "scores": [1] * 9 + [-1]}, 422, "scores[9]"),
    ("scores-and-preference", {"region": "r199", "scores": [1] * 10, "preference": "uniform"},
     422, "scores"),
    ("unknown-preference", {"region": "r199", "preference": "museums"}, 422, "preference"),
    ("unknown-method", {"region": "r199", "method": "sampling"}, 422, "method"),
    ("beams-zero", {"region": "r199", "beams": 0}, 422, "beams"),
    ("beams-too-many", {"region": "r199", "beams": 129}, 422, "beams"),
    ("beams-float", {"region": "r199", "beams": 4.5}, 422, "beams"),
    ("no-champion", {"region": "pr99"}, 409, "region"),
]


@pytest.mark.parametrize("body,status,field", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_request_gets_4xx_naming_the_field(service, body, status, field):
    """Each class of bad input gets its 4xx status and a JSON error whose message names the
    field (unknown region 404, no champion 409, malformed body 400, the rest 422)."""
    got, ans = _post(f"{service.url}/plan", body)
    assert got == status, ans
    assert ans["field"] == field and field.split("[")[0] in ans["error"]


def test_body_over_size_limit_gets_413(service):
    """A body over 256 KB is refused with 413 before it is parsed."""
    body = b'{"region": "r199", "pad": "' + b"x" * MAX_BODY_BYTES + b'"}'
    status, ans = _post(f"{service.url}/plan", body)
    assert status == 413 and "limit" in ans["error"]


def test_burst_of_bad_requests_then_good_ones_are_served(service):
    """40 bad requests from 4 concurrent clients all get 4xx, and the same replica (same
    process) then serves good requests."""
    _, before = _get(f"{service.url}/healthz")
    bodies = [b[1] for b in BAD] * 2
    bodies = bodies[:40] + [b"\xff\xfe not json", b'{"region": "r199", "x": ' + b"[" * 5000]
    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda b: _post(f"{service.url}/plan", b)[0], bodies))
    assert all(400 <= c < 500 for c in codes), codes
    with ThreadPoolExecutor(4) as pool:
        good = list(pool.map(lambda rid: _post(f"{service.url}/plan", {"region": rid}),
                             SERVED * 3))
    assert all(status == 200 for status, _ in good)
    _, after = _get(f"{service.url}/healthz")
    assert after["pid"] == before["pid"]


def test_new_champion_is_picked_up_without_restart(service):
    """Registering a better model moves the champion alias; the running planner serves the new
    version within a few seconds, without a restart."""
    region = service.catalog.region("r199")
    body = {"region": "r199", "method": "greedy"}
    old = _post(f"{service.url}/plan", body)[1]["model_version"]
    new = _register(region, service.root, seed=7, val_score=5.0, uri=service.uri)
    assert new != old and _champion("r199", service.uri) == new
    deadline = time.monotonic() + 20
    seen = old
    while seen != new and time.monotonic() < deadline:
        time.sleep(0.3)
        status, ans = _post(f"{service.url}/plan", body)
        assert status == 200
        seen = ans["model_version"]
    assert seen == new
    _check_answer(service, body, ans)
    assert _get(f"{service.url}/healthz")[1]["models"]["r199"] == new


def test_cli_plan_in_process(service, tmp_path, capsys):
    """`optw plan` solves without a server, from the registry champion or a checkpoint, and
    prints a readable itinerary (or JSON); bad input is a one-line error, exit code 2."""
    import torch

    from optw.cli import main
    from optw.model import ModelConfig, PointerNet, save_model

    cat = str(service.catalog.path)
    args = ["plan", "--region", "t199", "--start", "40,60", "--from", "09:00", "--to", "18:00",
            "--catalog", cat, "--tracking-uri", service.uri]
    assert main([*args, "--beams", "4"]) == 0
    out = capsys.readouterr().out
    assert "Trip in t199" in out and "09:00" in out and "total" in out
    assert f"model version {_champion('t199', service.uri)}" in out
    torch.manual_seed(3)
    ckpt = save_model(PointerNet(ModelConfig()), tmp_path / "m.pt")
    assert main([*args, "--checkpoint", str(ckpt), "--json", "--method", "greedy"]) == 0
    ans = json.loads(capsys.readouterr().out)
    assert ans["model_version"] is None and ans["method"] == "greedy"
    _check_answer(service, {"region": "t199"}, ans)
    assert main([*args, "--preference", "nope"]) == 2
    assert "preference" in capsys.readouterr().err
