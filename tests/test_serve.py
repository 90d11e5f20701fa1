"""The trip planner for real: a local Ray with Serve on a free loopback port, a real MLflow
sqlite store in a temporary folder, untrained (random) models registered for the tiny regions
r199 and t199 (pr99 has no champion). One planner serves the whole module.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import assert_names_field, bad_tourists
from optw.catalog import Catalog, sample_tourists
from optw.env import check_route
from optw.serve import (
    MAX_BODY_BYTES,
    PREFERENCES,
    PlanError,
    format_time,
    parse_time,
    preference_scores,
)
from planner_service import (
    Service,
    check_answer,
    first_plan,
    get_json,
    post_json,
    register_untrained,
    serve_champions,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SERVED = ("r199", "t199")  # regions with a champion; pr99 has none


@pytest.fixture(scope="module")
def service(tmp_path_factory, tiny_catalog) -> Service:
    """The planner on a free loopback port, registry in a temporary sqlite store; each served
    region's model loaded by a first plan (which may get 503 while it loads on a busy
    machine), so the tests see the steady state."""
    for svc in serve_champions(tiny_catalog, SERVED, tmp_path_factory.mktemp("planner"), 0.5):
        for rid in SERVED:
            assert first_plan(f"{svc.url}/plan", {"region": rid, "method": "greedy"})[0] == 200
        yield svc


def _champion(rid: str, uri: str) -> int:
    from optw.tracking import champion

    return champion(rid, uri=uri).version


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


def _settle(cache: Any, region: str) -> None:
    """Wait for the background lookup of ``region`` in ``cache`` to end (a test helper)."""
    pending = cache._entries[region].pending
    if pending is not None:
        concurrent.futures.wait([pending], timeout=60)


def _until(cond: Any, limit: float = 60) -> None:
    """Poll ``cond`` until true (a generous limit: only a hang fails it)."""
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_model_cache_checks_alias_at_most_every_interval(monkeypatch):
    """RegistryModels asks the registry at most once per check interval (a fake clock), loads
    a version only when the alias moved (in the background: the request that finds the check
    due is served with the cached model, the new version serves the next ones), keeps serving
    its cached model when the registry fails, and says 503 / 409 for a region without a
    cached model when the registry is down / the region has no champion."""
    import types

    import optw.tracking as tracking
    from optw.serve import RegistryModels

    state = {"version": 1, "fail": False, "checks": 0, "loads": []}
    now = [0.0]

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
    cache = RegistryModels("sqlite:///unused.db", check_interval=10.0, clock=lambda: now[0])
    try:
        assert cache.get("r").model == "m1" and cache.get("r").model == "m1"
        assert state["checks"] == 1 and state["loads"] == [1]
        state["version"] = 2
        now[0] = 9.0
        assert cache.get("r").version == 1 and state["checks"] == 1  # within the interval
        now[0] = 11.0
        assert cache.get("r").version == 1  # check due: served cached, lookup in background
        _settle(cache, "r")
        assert cache.get("r").version == 2 and state["loads"] == [1, 2]
        assert state["checks"] == 2
        state["fail"] = True
        now[0] = 30.0
        assert cache.get("r").version == 2  # registry down: the cached model keeps serving
        _settle(cache, "r")
        assert cache.get("r").version == 2 and state["checks"] == 3
        with pytest.raises(PlanError) as err:
            cache.get("other")
        assert err.value.status == 503
        state["fail"] = False
        with pytest.raises(PlanError) as err:
            cache.get("none")
        assert err.value.status == 409 and "champion" in err.value.message
    finally:
        cache.close()


def test_model_cache_never_waits_for_a_hung_registry_with_a_cached_model(monkeypatch):
    """A registry that accepts a lookup and does not answer (a hung MLflow server): a region
    with a cached model is served with it while the lookup is still hanging (not after the
    cache's timeout: the timeout here is longer than the hang, so a cache that waited would
    see the lookup end first), a region without one gets 503 naming the registry once the
    timeout passes, 12 concurrent requests are all answered, and only one lookup per region
    is in flight. Asserts what is answered while the registry hangs, not how fast (under load
    the suite once got 503 for the cached model after a 2 s wait)."""
    import threading
    import types

    import optw.tracking as tracking
    from optw.serve import RegistryModels

    hang, ended = threading.Event(), threading.Event()
    calls: dict[str, int] = {}

    def champion(region, uri=None):
        calls[region] = calls.get(region, 0) + 1
        if calls[region] > 1 or region == "new":
            hang.wait(120)  # the registry stops answering
            ended.set()
        return types.SimpleNamespace(version=1)

    def load_solver(name, uri=None, dst_path=None):
        return types.SimpleNamespace(model="m1", version=1)

    monkeypatch.setattr(tracking, "champion", champion)
    monkeypatch.setattr(tracking, "load_solver", load_solver)
    slow = RegistryModels("http://registry.invalid", check_interval=0.0, timeout=600)
    cache = RegistryModels("http://registry.invalid", check_interval=0.0, timeout=0.5)
    try:
        assert slow.get("old").version == 1  # cached before the registry hangs
        for _ in range(3):  # each call finds the check due; the lookup hangs
            assert slow.get("old").version == 1 and not ended.is_set()
        _until(lambda: calls["old"] == 2)  # the background lookup has started, and hangs
        assert slow.get("old").version == 1 and calls["old"] == 2  # one lookup in flight
        calls.clear()
        assert cache.get("old").version == 1
        with pytest.raises(PlanError) as err:
            cache.get("new")
        assert err.value.status == 503 and err.value.field == "region"
        assert "did not answer within 0.5 s" in err.value.message

        def one(region: str) -> int:
            try:
                return cache.get(region).version or 0
            except PlanError as exc:
                return exc.status

        with ThreadPoolExecutor(12) as pool:
            got = list(pool.map(one, ["old", "new"] * 6))
        assert got == [1, 503] * 6 and not ended.is_set()
        _until(lambda: calls.get("old") == 2)
        assert calls == {"old": 2, "new": 1}  # one lookup in flight per region
    finally:
        hang.set()
        slow.close()
        cache.close()


def _bad_requests(catalog: Catalog) -> list[tuple[str, dict[str, Any], str]]:
    """The generated bad-tourist family as /plan requests of every tiny region (the planner
    has no tourist ids, and fills absent fields with the benchmark's), plus a missing region."""
    out: list[tuple[str, dict[str, Any], str]] = [("missing-region", {"start": [1, 2]},
                                                   "region")]
    for rid in catalog.list_regions():
        for case, bad, field in bad_tourists(catalog.region(rid), required=False):
            if field != "tourist":
                body = {"region": rid, **{k: v for k, v in bad.items() if k != "tourist"}}
                out.append((f"{rid}:{case}", body, field))
    return out


def test_parse_rejects_each_generated_bad_tourist(tiny_catalog):
    """Every request of the generated bad-tourist family is refused by the planner's parsing
    (what /plan and `optw plan` run first) with a PlanError 422 whose body is
    {error, field, status}, the one-line message starting with the field."""
    from optw.serve import Planner

    planner = Planner(tiny_catalog, models=None)  # parsing needs no model
    for case, body, field in _bad_requests(tiny_catalog):
        for given in (body, json.dumps(body).encode()):
            with pytest.raises(PlanError) as err:
                planner.parse(given)
            got = err.value.to_dict()
            assert (got["status"], got["field"]) == (422, field), (case, got)
            assert got["error"].startswith(f"{field}:"), (case, got)
            assert_names_field(got["error"], field)


def test_reachable_points_are_the_env_first_step_mask(tiny_catalog, catalog):
    """The planner's "can be visited alone" set (the env's mask at the first step) is exactly
    the set of points j whose route [start, j, end] the independent validator accepts, for
    generated tourists of tiny and real regions (short days included)."""
    from optw.serve.request import PlanRequest, reachable

    for cat, rid in ((tiny_catalog, "r199"), (tiny_catalog, "t199"), (catalog, "c101"),
                     (catalog, "pr01")):
        region = cat.region(rid)
        tourists = sample_tourists(region, 12, rng=3)
        for k in range(len(tourists)):
            t_end = float(tourists.t_end[k]) if k % 3 else float(tourists.t_start[k]) + 40
            req = PlanRequest(region, tuple(tourists.start_xy[k]), float(tourists.t_start[k]),
                              t_end, tourists.scores[k, 1:-1], None, "beam", 4, False)
            one = req.tourists()
            expect = [check_route(region, [0, j, region.n_nodes - 1], one, 0).ok
                      for j in range(1, region.n_nodes - 1)]
            assert reachable(req).tolist() == expect, (rid, k)


# ----------------------------------------------------------------------------- options


@pytest.fixture
def no_work(tmp_path, monkeypatch):
    """Bad invocations run here: Ray cannot start (ray.init, serve.start and serve.run fail
    the test), the current folder and the temp folder are empty folders checked afterwards."""
    import tempfile

    import ray
    from ray import serve

    def refuse(*args, **kwargs):
        raise AssertionError("Ray or Serve was started for a bad invocation")

    for target, name in ((ray, "init"), (serve, "start"), (serve, "run")):
        monkeypatch.setattr(target, name, refuse)
    for name in ("cwd", "tmp", "inputs", "store"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}")
    was_running = ray.is_initialized()
    yield tmp_path
    assert ray.is_initialized() == was_running


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


def _blackhole() -> Any:
    """A TCP socket that listens and never answers (a hung server): connections complete in
    the kernel's backlog, requests get no reply."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def _run_bad(argv: list[str], capsys) -> tuple[int, str, float]:
    from optw.cli import main

    t0 = time.monotonic()
    code = main(argv)
    out, err = capsys.readouterr()
    assert out == "", (argv, out)
    return code, err, time.monotonic() - t0


def _assert_one_line(argv: list[str], code: int, err: str, elapsed: float, command: str,
                     option: str) -> None:
    assert code == 2, (argv, code, err)
    assert err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    assert err.startswith(f"optw {command}: error: --"), (argv, err)
    assert option in err, (argv, option, err)
    # a hang guard, not a speed test: the reachability checks give up after 3 s, a hung
    # server without them held the command for minutes (generous for a loaded machine)
    assert elapsed < 90, (argv, elapsed)


def _bad_serve(tmp: Path, catalog: Path) -> list[tuple[list[str], str]]:
    """Generated bad `optw serve` invocations -> the option each error must name."""
    from optw.serve.settings import local_cpus
    from optw.tracking.server import free_port

    cases: list[tuple[list[str], str]] = []

    def add(option: str, values: list[str], name: str | None = None) -> None:
        cases.extend(([f"{option}={v}"], name or option) for v in values)

    add("--port", ["-1", "65536", "70000", "abc", "1.5", "", "8e3", "0x50"])
    add("--replicas", ["0", "-1", "x", "1.5", "2000", "", str(2 * local_cpus() + 1)])
    add("--solve-threads", ["0", "-2", "17", "x", "2.5", "", str(2 * local_cpus() + 2)])
    add("--check-interval", ["-1", "nan", "inf", "-inf", "x", "1e9", ""])
    add("--registry-timeout", ["0", "-1", "nan", "1e9"])
    add("--request-timeout", ["0", "nan", "inf"])
    add("--host", ["", " ", "a b", "192.0.2.1"])
    add("--catalog", ["/nonexistent", str(tmp / "inputs" / "scores.json"), str(tmp / "inputs"),
                      ""])
    add("--tracking-uri", [f"http://127.0.0.1:{free_port()}", "",
                           f"sqlite:///{tmp / 'no-such-dir' / 'mlflow.db'}"])
    add("--ray-address", ["", "a b", f"127.0.0.1:{free_port()}", "host:99999"])
    return [(["serve", f"--catalog={catalog}", *args], option) for args, option in cases]


def test_bad_serve_options_fail_before_ray(no_work, capsys, tiny_catalog):
    """Every generated bad `optw serve` option (ports, replicas, solve threads, intervals,
    timeouts, host, catalog, tracking store, Ray address, a port in use, a hung tracking
    server) exits 2 with one line naming the option, no traceback, within seconds, before Ray
    or Serve start, writing nothing. (`--port 70000` used to be a traceback, `--replicas 0`
    failed only after Ray started, `--check-interval -1` and `--solve-threads 0` were
    accepted, and a bad catalog said only "Deploying application planner failed".)"""
    tmp = no_work
    (tmp / "inputs" / "scores.json").write_text("[1, 2]")
    cases = _bad_serve(tmp, tiny_catalog.path)
    busy, hung = _blackhole(), _blackhole()
    try:
        cases.append((["serve", f"--catalog={tiny_catalog.path}",
                       f"--port={busy.getsockname()[1]}"], "--port"))
        cases.append((["serve", f"--catalog={tiny_catalog.path}",
                       f"--tracking-uri=http://127.0.0.1:{hung.getsockname()[1]}"],
                      "--tracking-uri"))
        before = _tree(tmp)
        for argv, option in cases:
            code, err, elapsed = _run_bad(argv, capsys)
            _assert_one_line(argv, code, err, elapsed, "serve", option)
    finally:
        busy.close()
        hung.close()
    code, err, _ = _run_bad(["serve", "--catalog=/nonexistent"], capsys)
    assert code == 2 and "--catalog: no region catalog at /nonexistent" in err
    assert _tree(tmp) == before
    assert list((tmp / "tmp").iterdir()) == [] and list((tmp / "cwd").iterdir()) == []


def _bad_plan(tmp: Path) -> list[tuple[list[str], str]]:
    """Generated bad `optw plan` invocations (region t199) -> the option each must name."""
    from optw.tracking.server import free_port

    inputs = tmp / "inputs"
    files = {"missing": inputs / "missing.json", "not-json": inputs / "bad.json",
             "short": inputs / "short.json", "nan": inputs / "nan.json",
             "string": inputs / "string.json"}
    files["not-json"].write_text("[1, 2,")
    files["short"].write_text("[1, 2, 3]")
    files["nan"].write_text("[" + ", ".join(["1"] * 11 + ["NaN"]) + "]")
    files["string"].write_text(json.dumps([1] * 11 + ["x"]))
    garbage = inputs / "garbage.pt"
    garbage.write_bytes(b"not a model")
    cases: list[tuple[list[str], str]] = []

    def add(option: str, values: list[str], name: str | None = None) -> None:
        cases.extend(([f"{option}={v}"], name or option) for v in values)

    add("--start", ["a,b", "1", "1,2,3", "nan,1", "1,inf", "1e400,1", "99999,1", "1,-99999",
                    ""])
    add("--from", ["abc", "nan", "inf", "-5", "99:00", "9am", "25:61", "1e300", ""])
    add("--to", ["abc", "-inf", "99:00", "0"])
    add("--beams", ["0", "129", "-1", "x", "4.5", ""])
    add("--method", ["sampling", "", "BEAM"])
    add("--preference", ["museums", ""])
    add("--scores", [str(f) for f in files.values()])
    add("--region", ["nope", ""])
    add("--catalog", ["/nonexistent", ""])
    add("--checkpoint", [str(inputs / "missing.pt"), str(garbage)])
    add("--tracking-uri", [f"http://127.0.0.1:{free_port()}", "",
                           f"sqlite:///{tmp / 'no-such-dir' / 'mlflow.db'}",
                           f"sqlite:///{tmp / 'store' / 'mlflow.db'}"])  # no store there
    cases.append((["--from=600", "--to=500"], "--to"))
    cases.append((["--scores", str(files["short"]), "--preference=uniform"], "--scores"))
    return cases


def test_bad_plan_options_fail_before_any_work(no_work, capsys, tiny_catalog):
    """Every generated bad `optw plan` option (start, times, beams, method, preference, score
    files, region, catalog, checkpoint, tracking store, a hung tracking server) exits 2 with
    one line naming the option (and the request field it became), no traceback, within
    seconds, before any model is loaded, writing nothing (no mlflow.db is created)."""
    tmp = no_work
    hung = _blackhole()
    try:
        cases = _bad_plan(tmp)
        cases.append(([f"--tracking-uri=http://127.0.0.1:{hung.getsockname()[1]}"],
                      "--tracking-uri"))
        before = _tree(tmp)
        for args, option in cases:
            argv = ["plan", "--region=t199", f"--catalog={tiny_catalog.path}", *args]
            code, err, elapsed = _run_bad(argv, capsys)
            _assert_one_line(argv, code, err, elapsed, "plan", option)
    finally:
        hung.close()
    assert _tree(tmp) == before
    assert list((tmp / "tmp").iterdir()) == [] and list((tmp / "cwd").iterdir()) == []


def _optw() -> str:
    import shutil
    import sys

    return shutil.which("optw", path=str(Path(sys.executable).parent)) or "optw"


def test_serve_bad_port_in_a_subprocess(tmp_path):
    """The real console script: `optw serve --port 70000` (a traceback before) exits 2 with
    one line naming --port, quickly, with no Ray started (nothing on stdout, no Ray log)."""
    import subprocess

    proc = subprocess.run([_optw(), "serve", "--port", "70000"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("optw serve: error: --port: ") and "70000" in proc.stderr
    assert "ray" not in proc.stderr.lower() and list(tmp_path.iterdir()) == []


def test_plan_with_unreachable_tracking_server_fails_fast(tmp_path, tiny_catalog):
    """`optw plan` against a tracking server that refuses connections or accepts them and
    never answers (it used to wait for ever), named by --tracking-uri or by
    $MLFLOW_TRACKING_URI, exits 2 within seconds with one line naming where the URI came
    from."""
    import os
    import subprocess

    from optw.tracking.server import free_port

    hung = _blackhole()
    try:
        # each kind of failure once, each way of naming the URI once (every pairing took
        # four processes for the same two messages)
        for uri, via_env in ((f"http://127.0.0.1:{free_port()}", False),
                             (f"http://127.0.0.1:{hung.getsockname()[1]}", True)):
            env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
            args = [_optw(), "plan", "--region", "t199", "--catalog", str(tiny_catalog.path)]
            if not via_env:
                args += ["--tracking-uri", uri]
            t0 = time.monotonic()
            proc = subprocess.run(args, capture_output=True, text=True, timeout=300,
                                  cwd=tmp_path, env=env)
            elapsed = time.monotonic() - t0
            name = "$MLFLOW_TRACKING_URI" if via_env else "--tracking-uri"
            assert proc.returncode == 2 and proc.stdout == "", proc.stderr
            assert proc.stderr.startswith(f"optw plan: error: {name}: MLflow tracking "
                                          f"server {uri} is unreachable"), proc.stderr
            # a hang guard, not a speed test: MLflow's own retries took minutes
            assert proc.stderr.count("\n") == 1 and elapsed < 90, (elapsed, proc.stderr)
    finally:
        hung.close()
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- service


def test_regions_and_healthz(service):
    """GET /regions lists every catalog region with its points; /regions/{id} the points
    themselves; /healthz answers ok."""
    status, regions = get_json(f"{service.url}/regions")
    assert status == 200
    assert {r["region"]: r["points"] for r in regions} == {"r199": 10, "pr99": 14, "t199": 12}
    assert {r["coords"] for r in regions} == {"xy"}
    status, one = get_json(f"{service.url}/regions/t199")
    assert status == 200 and len(one["points"]) == 12 and set(one["preferences"]) == set(
        PREFERENCES)
    assert one["coords"] == "xy" and one["points"][0]["name"] == "POI 1"
    assert one["points"][0]["opening_clock"] == format_time(one["points"][0]["opening"])
    assert get_json(f"{service.url}/regions/nope")[0] == 404
    status, health = get_json(f"{service.url}/healthz")
    assert status == 200 and health["status"] == "ok" and health["regions"] == 3


def test_planner_page_and_its_script_are_served(service):
    """GET / is the planner page (HTML that loads its script from /static/, nothing from
    elsewhere); the script is served as JavaScript; an unknown static file is the planner's
    JSON 404 naming the path."""
    import re

    with urllib.request.urlopen(f"{service.url}/", timeout=30) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/html")
        html = resp.read().decode()
    assert "<svg" in html and 'src="static/planner.js"' in html
    assert not re.search(r"(src|href)=\"(https?:)?//", html)  # no external resources
    with urllib.request.urlopen(f"{service.url}/static/planner.js", timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/javascript")
        assert "window.planner" in resp.read().decode()
    for path in ("/static/nope.js", "/static/..%2Fapp.py", "/static/"):
        status, body = get_json(f"{service.url}{path}")
        assert status == 404 and body["field"] == "path", (path, body)


@pytest.mark.parametrize("method", ["greedy", "beam", "active-search"])
def test_plan_returns_valid_itinerary(service, method):
    """POST /plan answers a feasible route (checked with check_route) from start to end with
    the validator's schedule and score, and the champion's version, for every method."""
    for rid in SERVED:
        body = {"region": rid, "start": {"x": 20.0, "y": 30.0}, "method": method}
        if method == "beam":
            body["beams"] = 4
        status, ans = post_json(f"{service.url}/plan", body)
        assert status == 200, ans
        assert ans["region"] == rid and ans["method"] == method
        assert ans["model_version"] == _champion(rid, service.uri)
        assert ans["solve_ms"] > 0
        check_answer(service, body, ans)


def test_plan_with_clock_times_scores_and_preferences(service):
    """"HH:MM" times are minutes of the day; explicit scores and every preference profile give
    valid itineraries whose score is computed with those scores."""
    region = service.catalog.region("t199")
    base = {"region": "t199", "start": {"x": 50, "y": 50}, "t_start": "09:00",
            "t_end": "17:30"}
    status, ans = post_json(f"{service.url}/plan", base)
    assert status == 200 and (ans["t_start"], ans["t_end"]) == (540.0, 1050.0) and ans["clock"]
    check_answer(service, base, ans)
    for name in PREFERENCES:
        body = {**base, "preference": name}
        status, ans = post_json(f"{service.url}/plan", body)
        assert status == 200 and ans["preference"] == name
        check_answer(service, body, ans)
        if name == "uniform":
            assert ans["score"] == ans["visits"]
    scores = [float(i % 4) for i in range(region.n_points)]
    body = {**base, "scores": scores, "method": "beam", "beams": 8}
    status, ans = post_json(f"{service.url}/plan", body)
    assert status == 200 and ans["preference"] is None
    check_answer(service, body, ans)


def test_unreachable_tourist_gets_empty_itinerary(service):
    """A tourist who can reach no point (far away, or a one-minute day) gets [start, end] with
    score 0 and HTTP 200, not an error."""
    for body in ({"region": "r199", "start": {"x": 5000, "y": -5000}},
                 {"region": "t199", "t_start": 600, "t_end": 601, "method": "greedy"}):
        status, ans = post_json(f"{service.url}/plan", body)
        assert status == 200, ans
        assert [s["kind"] for s in ans["route"]] == ["start", "end"]
        assert ans["score"] == 0 and ans["visits"] == 0
        check_answer(service, body, ans)


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
    got, ans = post_json(f"{service.url}/plan", body)
    assert got == status, ans
    assert ans["field"] == field and field.split("[")[0] in ans["error"]


def test_bad_tourist_family_over_http_gets_422(service):
    """Over HTTP too, every request of the generated bad-tourist family (NaN and Infinity
    sent as JSON tokens) gets 422 and the JSON {error, field, status} naming the field."""
    for case, body, field in _bad_requests(service.catalog):
        status, ans = post_json(f"{service.url}/plan", json.dumps(body).encode())
        assert status == 422 and set(ans) == {"error", "field", "status"}, (case, ans)
        assert ans["field"] == field and ans["status"] == 422, (case, ans)
        assert_names_field(ans["error"], field)


def test_body_over_size_limit_gets_413(service):
    """A body over 256 KB is refused with 413 before it is parsed."""
    body = b'{"region": "r199", "pad": "' + b"x" * MAX_BODY_BYTES + b'"}'
    status, ans = post_json(f"{service.url}/plan", body)
    assert status == 413 and "limit" in ans["error"]


def test_burst_of_bad_requests_then_good_ones_are_served(service):
    """40 bad requests from 4 concurrent clients all get 4xx, and the same replica (same
    process) then serves good requests."""
    _, before = get_json(f"{service.url}/healthz")
    bodies = [b[1] for b in BAD] * 2
    bodies = bodies[:40] + [b"\xff\xfe not json", b'{"region": "r199", "x": ' + b"[" * 5000]
    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda b: post_json(f"{service.url}/plan", b)[0], bodies))
    assert all(400 <= c < 500 for c in codes), codes
    with ThreadPoolExecutor(4) as pool:
        good = list(pool.map(lambda rid: post_json(f"{service.url}/plan", {"region": rid}),
                             SERVED * 3))
    assert all(status == 200 for status, _ in good)
    _, after = get_json(f"{service.url}/healthz")
    assert after["pid"] == before["pid"]


def test_new_champion_is_picked_up_without_restart(service):
    """Registering a better model moves the champion alias; the running planner serves the new
    version within a few seconds, without a restart."""
    region = service.catalog.region("r199")
    body = {"region": "r199", "method": "greedy"}
    old = post_json(f"{service.url}/plan", body)[1]["model_version"]
    new = register_untrained(region, service.root, seed=7, val_score=5.0, uri=service.uri)
    assert new != old and _champion("r199", service.uri) == new
    deadline = time.monotonic() + 120  # a hang guard: under load a load can take long
    seen = old
    while seen != new and time.monotonic() < deadline:
        time.sleep(0.3)
        status, ans = post_json(f"{service.url}/plan", body)
        assert status == 200
        seen = ans["model_version"]
    assert seen == new
    check_answer(service, body, ans)
    assert get_json(f"{service.url}/healthz")[1]["models"]["r199"] == new


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
    check_answer(service, {"region": "t199"}, ans)
    assert main([*args, "--preference", "nope"]) == 2
    assert "preference" in capsys.readouterr().err


def _call(method: str, url: str, timeout: float = 30) -> tuple[int, Any]:
    req = urllib.request.Request(url, method=method, data=b"{}" if method != "GET" else None)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_unknown_path_and_wrong_method_get_the_documented_error_body(service):
    """404 (unknown path) and 405 (wrong method) answer {error, field, status} like every
    other error of the planner (they were FastAPI's {"detail": ...}); 405 keeps its Allow
    header's methods in the message."""
    for method, path, status, field in (
            ("GET", "/nope", 404, "path"), ("POST", "/plans", 404, "path"),
            ("GET", "/regions/t199/points", 404, "path"), ("GET", "/plan", 405, "method"),
            ("POST", "/regions", 405, "method"), ("DELETE", "/healthz", 405, "method"),
            ("PUT", "/plan", 405, "method")):
        got, body = _call(method, f"{service.url}{path}")
        assert got == status and set(body) == {"error", "field", "status"}, (path, body)
        assert body["field"] == field and body["status"] == status, (path, body)
        assert body["error"].startswith(f"{field}: ") and "\n" not in body["error"]
    assert "POST" in _call("GET", f"{service.url}/plan")[1]["error"]


def test_start_planner_refuses_edge_settings_before_deploying(service):
    """start_planner and build_app check every setting first, also with Ray running: 0 solve
    threads (a Semaphore(0) that accepted requests and never answered them), 0 replicas, a
    negative or NaN check interval, port 70000, a 0 s registry timeout, a missing catalog and
    an unknown solve_options method each raise one ValueError naming the parameter; the
    running planner is untouched."""
    from ray import serve

    from optw.serve import build_app, start_planner

    _, before = get_json(f"{service.url}/healthz")
    cat = service.catalog.path
    for kwargs, name in (({"solve_threads": 0}, "solve_threads"),
                         ({"solve_threads": 17}, "solve_threads"),
                         ({"num_replicas": 0}, "num_replicas"),
                         ({"check_interval": -1}, "check_interval"),
                         ({"check_interval": float("nan")}, "check_interval"),
                         ({"registry_timeout": 0}, "registry_timeout"),
                         ({"num_cpus": -0.5}, "num_cpus"),
                         ({"catalog": "/nonexistent"}, "catalog"),
                         ({"solve_options": {"sampling": {}}}, "solve_options")):
        for fn in (start_planner, build_app):
            with pytest.raises(ValueError, match=f"^{name}: ") as err:
                fn(**{"catalog": cat, "tracking_uri": service.uri, **kwargs})
            assert "\n" not in str(err.value)
    for kwargs, name in (({"port": 70000}, "port"), ({"host": ""}, "host"),
                         ({"request_timeout": 0}, "request_timeout")):
        with pytest.raises(ValueError, match=f"^{name}: "):
            start_planner(catalog=cat, tracking_uri=service.uri, **kwargs)
    assert list(serve.status().applications) == ["planner"]
    _, after = get_json(f"{service.url}/healthz")
    assert after["pid"] == before["pid"]


def test_requests_are_answered_while_the_mlflow_server_hangs_or_is_dead(service, tmp_path):
    """A planner on a real local `mlflow server` (check interval 0: a registry lookup on every
    request, the edge setting), with models registered for r199 and t199 and only r199
    loaded: while the server is stopped (SIGSTOP: it accepts connections and never answers)
    and after it is killed, every request is answered: r199 with its cached model (200,
    without waiting for the registry at all), t199 with 503 {error, field, status} naming the
    registry, /healthz too; also a burst of concurrent requests. (Requests used to wait for
    MLflow's own retries, a minute and more; then, under load, the cached model got 503 after
    a 2 s wait for the registry.) The HTTP timeouts only catch a hang: no speed is asserted."""
    import os
    import signal
    import subprocess

    from ray import serve

    from optw.serve.app import build_app
    from optw.tracking.server import free_port, server_command, stop_server, wait_for_server

    port = free_port()
    cmd = server_command(port=port, backend_store_uri=f"sqlite:///{tmp_path / 'server.db'}",
                         artifacts_destination=tmp_path / "art")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    base = f"{service.url}/dead"
    deployed = False
    try:
        wait_for_server(uri, 120, proc)
        for i, rid in enumerate(SERVED):
            register_untrained(service.catalog.region(rid), tmp_path, seed=20 + i,
                               val_score=1.0, uri=uri)
        serve.run(build_app(service.catalog.path, uri, check_interval=0.0,
                            registry_timeout=2.0), name="planner-dead", route_prefix="/dead")
        deployed = True
        status, ans = first_plan(f"{base}/plan", {"region": "r199", "method": "greedy"})
        assert status == 200 and ans["model_version"] == 1, ans

        def check_answers(phase: str) -> None:
            assert get_json(f"{base}/healthz")[0] == 200
            status, ans = post_json(f"{base}/plan", {"region": "r199", "method": "greedy"}, 120)
            assert status == 200 and ans["model_version"] == 1, (phase, ans)
            status, ans = post_json(f"{base}/plan", {"region": "t199"}, 120)
            assert status == 503 and set(ans) == {"error", "field", "status"}, (phase, ans)
            assert ans["field"] == "region" and "registry" in ans["error"], (phase, ans)
            with ThreadPoolExecutor(6) as pool:
                got = list(pool.map(
                    lambda rid: post_json(f"{base}/plan", {"region": rid, "method": "greedy"},
                                      120)[0], ["r199", "t199"] * 3))
            assert got == [200, 503] * 3, (phase, got)

        os.killpg(proc.pid, signal.SIGSTOP)  # hung: connections accepted, never answered
        check_answers("hung")
        os.killpg(proc.pid, signal.SIGKILL)  # dead: connections refused
        proc.wait(30)
        check_answers("dead")
    finally:
        if deployed:
            serve.delete("planner-dead")
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGCONT)
            stop_server(proc)
        log.close()


def test_healthz_answers_while_more_solves_than_slots_are_in_flight(service):
    """/healthz is answered while 20 plans are in flight on a replica with one solve slot (a
    long active search holds it, 19 greedy plans wait): it reports them all in flight, more
    than the 16 that Ray Serve used to let in before queueing /healthz behind them (30
    concurrent plans once held /healthz for 24 s); then every plan is answered. Behaviour,
    not speed: /healthz must answer while the plans are still in flight."""
    from ray import serve

    from optw.serve.app import build_app

    base = f"{service.url}/busy"
    serve.run(build_app(service.catalog.path, service.uri, solve_threads=1,
                        solve_options={"active-search": {"epochs": 200}}),
              name="planner-busy", route_prefix="/busy")
    try:
        # load the model first (the first request of a region waits for the registry)
        assert first_plan(f"{base}/plan", {"region": "t199", "method": "greedy"})[0] == 200
        bodies = [{"region": "t199", "method": "active-search", "beams": 2}] + [
            {"region": "t199", "method": "greedy"}] * 19
        with ThreadPoolExecutor(len(bodies)) as pool:
            # the active search first, and the greedy plans only once it is in flight: sent
            # all at once, a few greedy plans could take the slot before it, finish at once
            # and never be seen in flight together with the rest
            deadline = time.monotonic() + 300  # a hang guard
            plans = [pool.submit(post_json, f"{base}/plan", bodies[0], 600)]
            while get_json(f"{base}/healthz")[1]["plans_in_flight"] < 1:
                assert not plans[0].done() and time.monotonic() < deadline, plans[0]
                time.sleep(0.01)
            time.sleep(0.2)  # past the model look-up and into the slot
            plans += [pool.submit(post_json, f"{base}/plan", b, 600) for b in bodies[1:]]
            seen = 0
            while seen < len(bodies) and not all(p.done() for p in plans):
                status, health = get_json(f"{base}/healthz")
                assert status == 200 and health["status"] == "ok"
                seen = max(seen, health["plans_in_flight"])
                assert time.monotonic() < deadline, seen
                time.sleep(0.05)
            codes = [p.result()[0] for p in plans]
        assert seen == len(bodies) and codes == [200] * len(bodies), (seen, codes)
        assert get_json(f"{base}/healthz")[1]["plans_in_flight"] == 0
    finally:
        serve.delete("planner-busy")


def test_plan_refuses_other_content_types_and_echoes_little(service):
    """POST /plan takes application/json only (415 naming content-type otherwise, also
    without the header); a 200 KB unknown key or preference and beams = 10**5000 (valid JSON,
    once "malformed JSON (Exceeds the limit (4300 digits)...)") get a short 422 naming the
    field: no error body echoes more than a few hundred bytes of the input."""
    url = f"{service.url}/plan"
    body = json.dumps({"region": "r199", "method": "greedy"}).encode()
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {} if ctype is None else {"Content-Type": ctype}
        req = urllib.request.Request(url, data=body, method="POST", headers=headers)
        if ctype is None:
            req.remove_header("Content-type")
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                got, ans = resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            got, ans = exc.code, json.loads(exc.read())
        assert got == 415 and ans["field"] == "content-type", (ctype, ans)
        assert ans["error"].startswith("content-type: expected application/json")
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json; charset=utf-8"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200
    big = "k" * 200_000
    for case, payload, field in (
            ("key", f'{{"region": "r199", "{big}": 1}}', None),
            ("preference", f'{{"region": "r199", "preference": "{big}"}}', "preference"),
            ("beams", '{"region": "r199", "beams": 1' + "0" * 5000 + "}", "beams"),
            ("negative-beams", '{"region": "r199", "beams": -1' + "0" * 5000 + "}", "beams")):
        status, ans = post_json(url, payload.encode())
        assert status == 422, (case, ans)
        assert len(json.dumps(ans)) < 1000, (case, len(json.dumps(ans)))
        if field:
            assert ans["field"] == field, (case, ans)
        if field == "beams":
            assert ans["error"].startswith("beams: ") and "out of range" in ans["error"]
