"""The planner page (``GET /``) in a real headless Chromium, driven over the DevTools protocol
like the report's browser test. The planner runs on a local Ray Serve (as in ``test_serve``)
with a copy of the tiny catalog plus a custom lat/lon region added with the catalog's own
``add_region`` (the made-up city of ``test_serve_latlon``), untrained champions registered
for t199 and the city. For each: the region picked, a start clicked on the map, hours typed,
Plan pressed; the itinerary the page shows must be the one ``POST /plan`` answers, and pass
the route validator. Screenshots: ``test-output/planner-page.png`` (the city) and
``test-output/planner-page-xy.png`` (t199).
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from chromium import (
    CHROMIUM_INSTALL,
    DevTools,
    find_chromium,
    page_errors,
    page_target,
    start_chromium,
)
from conftest import copy_catalog, stop_process
from planner_service import (
    CITY_CSV,
    Service,
    check_answer,
    check_legs,
    post_json,
    serve_champions,
    validate_answer,
)

CITY = "lisbonette"


@pytest.fixture(scope="module")
def service(tmp_path_factory, tiny_catalog) -> Service:
    """The planner on a free loopback port: the tiny catalog plus the city, champions for
    t199 and the city in a temporary sqlite registry."""
    from optw.catalog import Catalog, add_region

    root = tmp_path_factory.mktemp("planner-page")
    copy_catalog(tiny_catalog, root / "catalog")
    (root / "city.csv").write_text(CITY_CSV, encoding="utf-8")
    add_region(CITY, root / "city.csv", catalog=root / "catalog")
    yield from serve_champions(Catalog(root / "catalog"), ("t199", CITY), root, 30)


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _eval(devtools: DevTools, expression: str, timeout: float = 20.0) -> Any:
    """The JSON value of a JavaScript expression in the page (promises awaited)."""
    got = devtools.call("Runtime.evaluate", timeout=timeout, returnByValue=True,
                        awaitPromise=True, expression=f"JSON.stringify({expression})")
    if "exceptionDetails" in got:
        raise AssertionError(f"{expression}: {got['exceptionDetails']}")
    value = got["result"].get("value")
    return None if value is None else json.loads(value)


def _wait(devtools: DevTools, expression: str, what: str, timeout: float = 60.0) -> Any:
    """Poll a JavaScript expression until it is truthy; its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = _eval(devtools, expression)
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: {expression}; status: "
                         f"{_eval(devtools, 'document.body.innerText.slice(0, 2000)')}")


def _click(devtools: DevTools, x: float, y: float) -> None:
    """A real mouse click at page coordinates (CSS pixels)."""
    for kind in ("mousePressed", "mouseReleased"):
        devtools.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                      clickCount=1)


def _center(devtools: DevTools, selector: str, fx: float = 0.5, fy: float = 0.5) -> list[float]:
    rect = _eval(devtools, f"(r => [r.left, r.top, r.width, r.height])(document.querySelector("
                           f"{json.dumps(selector)}).getBoundingClientRect())")
    return [rect[0] + fx * rect[2], rect[1] + fy * rect[3]]


ITINERARY = ("[...document.querySelectorAll('#itinerary tr.stop')].map(tr => "
             "[Number(tr.dataset.node), tr.dataset.kind, ...[...tr.cells].map(td => "
             "td.textContent)])")


def _plan_through_page(devtools: DevTools, svc: Service, rid: str, click: tuple[float, float],
                       hours: tuple[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pick ``rid``, click the map at ``click`` (fractions of its width and height), type
    ``hours``, press Plan; check the page shows the answer and that POST /plan gives the same
    itinerary. Returns (the page's request, its answer)."""
    region = svc.catalog.region(rid)
    _eval(devtools, f"(s => {{ s.value = {json.dumps(rid)}; s.dispatchEvent(new Event("
                    f"'change')); return 1; }})(document.getElementById('region'))")
    _wait(devtools, f"window.planner.ready && window.planner.region === {json.dumps(rid)} && "
                    f"document.querySelectorAll('circle.poi').length === {region.n_points}",
          f"the points of {rid}")
    titles = _eval(devtools, "[...document.querySelectorAll('circle.poi title')]"
                             ".map(t => t.textContent)")
    names = [region.names[i] if region.names else f"POI {i}" for i in range(1, region.n_nodes - 1)]
    assert [t.split(": open ")[0] for t in titles] == names
    labels = _eval(devtools, "[...document.querySelectorAll('#names text')]"
                             ".map(t => t.textContent)")
    assert labels == (names if region.names else [])  # names on the map of a named region
    default = _eval(devtools, "window.planner.start")

    _click(devtools, *_center(devtools, "#map", *click))
    start = _wait(devtools, "window.planner.start", "the clicked start")
    latlon = getattr(region, "coords", "xy") == "latlon"
    assert start != default and set(start) == ({"lat", "lon"} if latlon else {"x", "y"})

    _eval(devtools, f"(() => {{ document.getElementById('t-start').value = '{hours[0]}';"
                    f" document.getElementById('t-end').value = '{hours[1]}'; return 1; }})()")
    _click(devtools, *_center(devtools, "#plan"))
    _wait(devtools, "window.planner.answer || document.getElementById('error').textContent",
          "the itinerary", timeout=120)
    assert _eval(devtools, "document.getElementById('error').textContent") == ""
    req = _eval(devtools, "window.planner.request")
    ans = _eval(devtools, "window.planner.answer")
    assert req == {"region": rid, "start": start, "t_start": hours[0], "t_end": hours[1],
                   "preference": "balanced", "method": "beam"}
    assert ans["clock"] and (ans["t_start_clock"], ans["t_end_clock"]) == hours

    # the page shows the answer: the list, the polyline, the marked points
    rows = _eval(devtools, ITINERARY)
    assert [r[0] for r in rows] == [s["node"] for s in ans["route"]]
    for row, s in zip(rows, ans["route"], strict=True):
        _, kind, stop, name, arrive, visit, leave, _score = row
        assert (kind, stop, name) == (s["kind"], str(s["stop"]), s["name"])
        assert arrive == ("" if kind == "start" else s["arrival_clock"])
        assert visit == (s["start_clock"] if kind == "visit" else "")
        assert leave == ("" if kind == "end" else s["leave_clock"])
    polyline = _eval(devtools, "document.getElementById('route').getAttribute('points')"
                               ".trim().split(/\\s+/).length")
    assert polyline == len(ans["route"])
    visited = _eval(devtools, "[...document.querySelectorAll('circle.poi.visited')]"
                              ".map(c => Number(c.dataset.node)).sort((a, b) => a - b)")
    assert visited == sorted(s["node"] for s in ans["route"][1:-1])
    legs = _eval(devtools, "document.querySelectorAll('#itinerary tr.leg').length")
    assert legs == len(ans["legs"]) == len(ans["route"]) - 1
    summary = _eval(devtools, "document.getElementById('summary').textContent")
    assert f"{ans['visits']} visit(s)" in summary and f"{hours[0]}-{hours[1]}" in summary

    # the same request over HTTP: the same itinerary, and the validator accepts it
    status, direct = post_json(f"{svc.url}/plan", req)
    assert status == 200
    assert [s["node"] for s in direct["route"]] == [s["node"] for s in ans["route"]]
    assert direct["score"] == ans["score"] and direct["legs"] == ans["legs"]
    validate_answer(region, ans)
    check_legs(region, ans)
    return req, ans


def _screenshot(devtools: DevTools, path) -> None:
    shot = devtools.call("Page.captureScreenshot", format="png", timeout=60)
    png = base64.b64decode(shot["data"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    path.write_bytes(png)


def test_planner_page_plans_routes_in_headless_chromium(service, output_dir, tmp_path):
    """Open /, and for t199 (x/y) and the lat/lon city: pick the region, click a start on the
    SVG map, set the hours, press Plan: the page draws the route (a polyline with one vertex
    per stop, the visited points marked) and lists the stops with names and HH:MM times;
    that itinerary equals POST /plan's answer to the request the page sent, which passes the
    validator. The city's start is sent as lat/lon and its stops carry the places' names. A
    bad time shows the API's error naming the field. No console errors, no request outside
    the planner."""
    from websockets.sync.client import connect

    binary = find_chromium()
    if binary is None:
        pytest.skip(f"chromium not found (install it: {CHROMIUM_INSTALL})")
    proc, port = start_chromium(binary, tmp_path / "chromium-profile")
    try:
        with connect(page_target(port), max_size=64 * 1024**2, open_timeout=10) as ws:
            devtools = DevTools(ws)
            devtools.load(f"{service.url}/", width=1300, height=820)
            _wait(devtools, "window.planner && window.planner.ready", "the first region")
            options = _eval(devtools, "[...document.querySelectorAll('#region option')]"
                                      ".map(o => o.value)")
            assert sorted(options) == sorted(["pr99", "r199", "t199", CITY])

            req, ans = _plan_through_page(devtools, service, "t199", (0.3, 0.35),
                                          ("09:00", "17:30"))
            assert ans["coords"] == "xy" and ans["route"][0]["x"] == req["start"]["x"]
            check_answer(service, req, ans)
            _screenshot(devtools, output_dir / "planner-page-xy.png")

            city = service.catalog.region(CITY)
            req, ans = _plan_through_page(devtools, service, CITY, (0.55, 0.45),
                                          ("09:30", "18:00"))
            assert ans["coords"] == "latlon" and ans["visits"] >= 1
            assert (ans["start"]["lat"], ans["start"]["lon"]) == (req["start"]["lat"],
                                                                  req["start"]["lon"])
            x, y = city.to_xy(req["start"]["lat"], req["start"]["lon"])
            assert (ans["start"]["x"], ans["start"]["y"]) == pytest.approx((x, y))
            for s in ans["route"][1:-1]:
                assert s["name"] == city.names[s["node"]]
                assert (s["lat"], s["lon"]) == pytest.approx((city.lat[s["node"]],
                                                              city.lon[s["node"]]))
            _screenshot(devtools, output_dir / "planner-page.png")

            # a bad time: the API's message, naming the field, on the page
            _eval(devtools, "(() => { document.getElementById('t-end').value = '30:00';"
                            " return 1; })()")
            _click(devtools, *_center(devtools, "#plan"))
            error = _wait(devtools, "document.getElementById('error').textContent",
                          "the error message", timeout=60)
            assert error.startswith("t_end: ") and "outside the day" in error, error
            assert page_errors([e for e in devtools.events if not _is_expected_422(e)]) == []
            urls = [e["params"]["request"]["url"] for e in devtools.events
                    if e.get("method") == "Network.requestWillBeSent"]
            assert urls and all(u.startswith((service.url, "data:")) for u in urls), urls
    finally:
        stop_process(proc)


def _is_expected_422(event: dict[str, Any]) -> bool:
    """Chromium logs the deliberate 422 of the bad-time request as a failed resource load."""
    entry = event.get("params", {}).get("entry", {})
    return event.get("method") == "Log.entryAdded" and "422" in entry.get("text", "")
