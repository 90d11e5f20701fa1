"""The planner on regions with lat/lon coordinates and names (custom regions), in-process: the
request's ``{"lat", "lon"}`` start, the answer's names, clock times, lat/lon and travel legs,
the region detail the planner page draws, and the errors that name the start's fields.

The lat/lon region is read from a small made-up city's CSV written here, by the catalog's
own reader of custom regions (:func:`optw.catalog.build_custom_region`; no catalog folder is
needed); an untrained model solves.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from optw.catalog import Region, build_custom_region
from optw.serve import LoadedModel, PlanError, Planner, format_time
from optw.serve.cli import render_itinerary
from planner_service import CITY_CSV, check_legs, validate_answer

LAT0, LON0 = 38.7100, -9.1400  # the start place


def make_city(folder: Path, region_id: str = "lisbonette") -> Region:
    """The made-up city as a custom lat/lon region (walking at 4.5 km/h)."""
    path = folder / f"{region_id}.csv"
    path.write_text(CITY_CSV, encoding="utf-8")
    return build_custom_region(region_id, path)


class OneRegionCatalog:
    """The few catalog calls the planner makes, for regions built in a test."""

    def __init__(self, *regions: Region):
        self.regions = {r.id: r for r in regions}

    def __contains__(self, rid: object) -> bool:
        return rid in self.regions

    def __len__(self) -> int:
        return len(self.regions)

    def region(self, rid: str) -> Region:
        return self.regions[rid]


class UntrainedModels:
    """An untrained network for every region (the schedule, not the quality, is tested)."""

    def __init__(self) -> None:
        import torch

        from optw.model import ModelConfig, PointerNet

        torch.manual_seed(0)
        self.loaded = LoadedModel(PointerNet(ModelConfig()), 1, "untrained")

    def get(self, region_id: str) -> LoadedModel:
        return self.loaded


@pytest.fixture(scope="module")
def city(tmp_path_factory) -> Region:
    return make_city(tmp_path_factory.mktemp("city"))


@pytest.fixture(scope="module")
def planner(city, tiny_catalog) -> Planner:
    return Planner(OneRegionCatalog(city, tiny_catalog.region("t199")), UntrainedModels())


def test_latlon_start_gives_named_itinerary_with_clock_times_and_legs(planner, city):
    """A lat/lon region takes {"lat", "lon"} and "HH:MM": the start is converted with the
    region's to_xy, the route passes the validator, every stop has the region's name, lat/lon
    and HH:MM times, and the legs give depart/arrive/travel between consecutive stops."""
    start = {"lat": 38.712, "lon": -9.137}
    ans = planner.plan({"region": city.id, "start": start, "t_start": "09:00",
                        "t_end": "19:30", "method": "beam", "beams": 4})
    assert ans["coords"] == "latlon" and ans["clock"]
    assert (ans["t_start"], ans["t_end"]) == (540.0, 1170.0)
    assert (ans["t_start_clock"], ans["t_end_clock"]) == ("09:00", "19:30")
    x, y = city.to_xy(start["lat"], start["lon"])
    assert (ans["start"]["x"], ans["start"]["y"]) == pytest.approx((x, y))
    assert (ans["start"]["lat"], ans["start"]["lon"]) == (start["lat"], start["lon"])
    assert ans["visits"] >= 1, "the untrained model should still fit a visit into 10 hours"
    validate_answer(city, ans)
    check_legs(city, ans)
    first, last = ans["route"][0], ans["route"][-1]
    assert (first["name"], last["name"]) == ("start", "end")  # not the hotel: another start
    assert (first["lat"], first["lon"]) == (last["lat"], last["lon"]) == (38.712, -9.137)
    for s in ans["route"][1:-1]:
        assert s["name"] == city.names[s["node"]]
        assert (s["lat"], s["lon"]) == (city.lat[s["node"]], city.lon[s["node"]])
    text = render_itinerary(ans, city.n_points)
    assert "Trip in lisbonette from (38.712, -9.137), 09:00 to 19:30" in text
    assert all(s["name"] in text for s in ans["route"])


def test_latlon_region_default_start_is_the_named_start_node(planner, city):
    """Without a start, a lat/lon region's own start (node 0) is used: its name and lat/lon
    appear on the first and last stops."""
    ans = planner.plan({"region": city.id, "method": "greedy"})
    validate_answer(city, ans)
    check_legs(city, ans)
    assert ans["route"][0]["name"] == ans["route"][-1]["name"] == city.start_name \
        == "Hotel Central"
    assert (ans["start"]["lat"], ans["start"]["lon"]) == (LAT0, LON0)
    assert ans["t_start_clock"] == "08:00" and ans["t_end_clock"] == "20:00"


def test_xy_region_answer_has_poi_names_clock_times_and_legs(planner, tiny_catalog):
    """A benchmark (x/y) region keeps its numeric answer and gains "POI <node>" names, HH:MM
    times and legs, and no lat/lon."""
    region = tiny_catalog.region("t199")
    ans = planner.plan({"region": "t199", "start": {"x": 40, "y": 60}, "t_start": "09:00",
                        "t_end": "18:00", "beams": 4})
    assert ans["coords"] == "xy" and set(ans["start"]) == {"x", "y"}
    validate_answer(region, ans)
    check_legs(region, ans)
    assert [s["name"] for s in ans["route"]] == (
        ["start"] + [f"POI {s['node']}" for s in ans["route"][1:-1]] + ["end"])
    assert all("lat" not in s for s in ans["route"])


def test_region_detail_has_names_windows_and_latlon(planner, city, tiny_catalog):
    """GET /regions/{id}'s body (what the page draws): every point with its name, x/y, window
    (also as HH:MM), duration and score; lat/lon and "coords" for a lat/lon region."""
    detail = planner.region(city.id)
    assert detail["coords"] == "latlon" and len(detail["points"]) == city.n_points
    assert detail["named"] and not planner.region("t199")["named"]
    assert detail["start"]["name"] == "Hotel Central"
    assert (detail["start"]["lat"], detail["start"]["lon"]) == (LAT0, LON0)
    assert (detail["t_start_clock"], detail["t_end_clock"]) == ("08:00", "20:00")
    assert [p["name"] for p in detail["points"]][-1] == "Monastery"
    for p in detail["points"]:
        i = p["node"]
        assert p["name"] == city.names[i] and (p["lat"], p["lon"]) == (city.lat[i], city.lon[i])
        assert p["opening_clock"] == format_time(city.opening[i])
        assert p["closing_clock"] == format_time(city.closing[i])
    xy = planner.region("t199")
    assert xy["coords"] == "xy" and "lat" not in xy["points"][0]
    assert [p["name"] for p in xy["points"]] == [f"POI {i}" for i in range(1, 13)]
    assert tiny_catalog.region("t199").n_points == 12


BAD_STARTS = [
    # (id, region, start, field)
    ("latlon-on-xy", "t199", {"lat": 38.7, "lon": -9.1}, "start"),
    ("lat-only-on-xy", "t199", {"lat": 38.7}, "start"),
    ("xy-on-latlon", "lisbonette", {"x": 1, "y": 2}, "start"),
    ("list-on-latlon", "lisbonette", [38.7, -9.1], "start"),
    ("extra-key", "lisbonette", {"lat": 38.7, "lon": -9.1, "alt": 3}, "start"),
    ("lat-only", "lisbonette", {"lat": 38.7}, "start"),
    ("lat-91", "lisbonette", {"lat": 91, "lon": -9.1}, "start.lat"),
    ("lat--90.5", "lisbonette", {"lat": -90.5, "lon": -9.1}, "start.lat"),
    ("lon-181", "lisbonette", {"lat": 38.7, "lon": 181}, "start.lon"),
    ("lat-nan", "lisbonette", {"lat": math.nan, "lon": -9.1}, "start.lat"),
    ("lon-inf", "lisbonette", {"lat": 38.7, "lon": -math.inf}, "start.lon"),
    ("lat-string", "lisbonette", {"lat": "38.7", "lon": -9.1}, "start.lat"),
    ("lon-bool", "lisbonette", {"lat": 38.7, "lon": True}, "start.lon"),
    ("far-east", "lisbonette", {"lat": 38.7, "lon": 170}, "start.lon"),
    ("far-south", "lisbonette", {"lat": -80, "lon": -9.1}, "start.lat"),
]


@pytest.mark.parametrize("rid,start,field", [b[1:] for b in BAD_STARTS],
                         ids=[b[0] for b in BAD_STARTS])
def test_bad_start_is_422_naming_the_field(planner, rid, start, field):
    """lat/lon on an x/y region, x/y or a list on a lat/lon region, missing or extra keys,
    out-of-range, non-finite or non-number degrees, and a start far from the region each get
    422 with the field named first in a one-line message."""
    with pytest.raises(PlanError) as err:
        planner.parse({"region": rid, "start": start})
    got = err.value.to_dict()
    assert (got["status"], got["field"]) == (422, field), got
    assert got["error"].startswith(f"{field}: ") and "\n" not in got["error"]
    if field == "start":
        assert ("lat/lon" in got["error"]), got


def test_cli_plan_takes_lat_lon_for_a_lat_lon_region(tmp_path, tiny_catalog, capsys):
    """`optw plan --region CITY --start LAT,LON` (a catalog with the city added by
    `add_region`, a model file): the readable itinerary names the places and prints clock
    times; --json is the /plan answer with the lat/lon start, and passes the validator; a
    latitude out of range is one line naming --start (start.lat), exit code 2."""
    import json

    import torch

    from conftest import copy_catalog
    from optw.catalog import Catalog, add_region
    from optw.cli import main
    from optw.model import ModelConfig, PointerNet, save_model

    folder = copy_catalog(tiny_catalog, tmp_path / "catalog")
    (tmp_path / "city.csv").write_text(CITY_CSV, encoding="utf-8")
    add_region("lisbonette", tmp_path / "city.csv", catalog=folder)
    city = Catalog(folder).region("lisbonette")
    torch.manual_seed(1)
    ckpt = save_model(PointerNet(ModelConfig()), tmp_path / "m.pt")
    args = ["plan", "--region", "lisbonette", "--start", "38.712,-9.137", "--from", "09:00",
            "--to", "18:00", "--catalog", str(folder), "--checkpoint", str(ckpt), "--beams", "4"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Trip in lisbonette from (38.712, -9.137), 09:00 to 18:00" in out
    assert main([*args, "--json"]) == 0
    ans = json.loads(capsys.readouterr().out)
    assert (ans["start"]["lat"], ans["start"]["lon"]) == (38.712, -9.137)
    assert ans["visits"] >= 1 and all(s["name"] in out for s in ans["route"])
    validate_answer(city, ans)
    check_legs(city, ans)
    assert main([*args[:4], "95,-9.1", *args[5:]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("optw plan: error: --start (start.lat): 95 is outside") and \
        err.count("\n") == 1, err


def test_named_xy_custom_region_gets_names_without_latlon(tmp_path):
    """A custom region with x/y coordinates (minutes) and names: the answer names its places
    (its start place on the default start), gives no lat/lon, and refuses a lat/lon start."""
    path = tmp_path / "park.csv"
    path.write_text("name,x,y,visit_minutes,opens,closes,score\n"
                    "Gate,0,0,0,09:00,17:00,0\nPond,10,5,20,09:00,16:00,3\n"
                    "Maze,-8,12,45,10:00,16:00,5\nCafe,4,-9,30,09:00,16:30,2\n")
    park = build_custom_region("park", path)
    planner = Planner(OneRegionCatalog(park), UntrainedModels())
    ans = planner.plan({"region": "park", "beams": 8})
    assert ans["coords"] == "xy" and "lat" not in ans["start"] and ans["visits"] >= 1
    validate_answer(park, ans)
    check_legs(park, ans)
    assert ans["route"][0]["name"] == ans["route"][-1]["name"] == "Gate"
    assert {s["name"] for s in ans["route"][1:-1]} <= {"Pond", "Maze", "Cafe"}
    assert [p["name"] for p in planner.region("park")["points"]] == ["Pond", "Maze", "Cafe"]
    with pytest.raises(PlanError) as err:
        planner.parse({"region": "park", "start": {"lat": 1, "lon": 2}})
    assert (err.value.status, err.value.field) == (422, "start")
