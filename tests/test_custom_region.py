"""Custom regions ("bring your own region"): ``optw catalog add|remove``.

Fixtures under ``tests/fixtures/custom/``: ``town.csv`` / ``town.geojson`` (the same 10 points
of a small old town in lat/lon, plus the start place), ``grid.csv`` (8 points in x/y minutes)
and ``grid_matrix.csv`` (a travel-time matrix of its points). Every test works on a private
catalog of the three tiny synthetic benchmark regions, never on the project's catalog.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import write_tiny_source
from optw.catalog import (
    Catalog,
    CatalogError,
    CustomRegionError,
    add_region,
    build_catalog,
    build_custom_region,
    read_regions,
    remove_region,
    validation_tourists,
)
from optw.catalog.store import ILS_TOURISTS_META
from optw.cli import main as cli

FIX = Path(__file__).parent / "fixtures" / "custom"
ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "city"


@pytest.fixture(scope="module")
def base_catalog(tmp_path_factory) -> Path:
    """A built catalog of the three tiny benchmark regions (r199, pr99, t199)."""
    root = tmp_path_factory.mktemp("custom")
    src = write_tiny_source(root / "src")
    build_catalog(src, root / "catalog")
    return root / "catalog"


@pytest.fixture()
def cat_dir(base_catalog, tmp_path) -> Path:
    """A private copy of the tiny catalog for one test."""
    dst = tmp_path / "catalog"
    shutil.copytree(base_catalog, dst)
    return dst


@pytest.fixture()
def source_dir(tmp_path) -> Path:
    """The tiny benchmark source folder (for rebuilds)."""
    return write_tiny_source(tmp_path / "src")


def snapshot(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder`` (recursively), by relative path."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- building


def test_csv_and_geojson_give_the_same_region(cat_dir):
    """The CSV and the GeoJSON of the same places build identical regions (nodes, names,
    travel times), stored in the catalog with 64 validation tourists and the benchmark one."""
    add_region("town", FIX / "town.csv", catalog=cat_dir)
    add_region("town-geo", FIX / "town.geojson", catalog=cat_dir)
    cat = Catalog(cat_dir)
    a, b = cat.region("town"), cat.region("town-geo")
    for k in ("x", "y", "lat", "lon", "duration", "opening", "closing", "score"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)
    np.testing.assert_array_equal(a.distances(), b.distances())
    assert a.names == b.names and a.names[0] == "start" and a.names[-1] == "end"
    assert a.names[1] == "Cathedral" and a.start_name == "Station Square"
    assert a.n_points == 10 and a.group == "custom" and a.is_custom
    assert (a.t_start, a.t_end) == (540.0, 1080.0)  # 09:00-18:00, minutes since midnight
    assert a.opening[7] == 540 and a.closing[7] == 1020  # row 8 = node 7: plain minutes
    assert len(cat.validation("town")) == 64 and len(cat.benchmark("town")) == 1
    assert cat.list_regions(group="custom") == ["town", "town-geo"]
    assert cat.manifest["groups"]["custom"] == 2 and cat.manifest["regions"] == 5
    assert (cat_dir / "custom" / "town" / "points.csv").read_bytes() == \
        (FIX / "town.csv").read_bytes()
    assert (cat_dir / "custom" / "town-geo" / "points.geojson").exists()


def test_haversine_travel_time_matches_a_hand_value():
    """Lat/lon travel time = great-circle km ÷ speed, rounded down to 2 decimals: Station
    Square -> Cathedral is 0.3273 km by hand (Δlat 0.0029°, Δlon 0.0007° at 43.84°N), 4.364 min
    at 4.5 km/h, 2.182 min at 9 km/h."""
    km = math.hypot(0.0029 * 111.195, 0.0007 * 111.195 * math.cos(math.radians(43.839)))
    assert abs(km - 0.3273) < 1e-3
    for speed in (4.5, 9.0):
        r = build_custom_region("town", FIX / "town.csv", speed_kmh=speed)
        d = r.distances()
        hand = km / speed * 60
        assert abs(d[0, 1] - hand) / hand < 0.005
        assert d[0, 1] == math.floor(d[0, 1] * 100 + 1e-7) / 100
        assert d[1, 0] == d[0, 1] and d[0, -1] == 0 and d[-1, 0] == 0


def test_projection_contract():
    """Lat/lon regions: x/y are an equirectangular projection in minutes at the region's
    speed; to_xy and to_latlon are inverse; a start given on a place gives that place's
    travel times; xy regions refuse the conversions."""
    r = build_custom_region("town", FIX / "town.csv")
    x, y = r.to_xy(r.lat, r.lon)
    np.testing.assert_allclose(x, r.x, atol=1e-9)
    np.testing.assert_allclose(y, r.y, atol=1e-9)
    lat, lon = r.to_latlon(r.x, r.y)
    np.testing.assert_allclose(lat, r.lat, atol=1e-9)
    np.testing.assert_allclose(lon, r.lon, atol=1e-9)
    assert isinstance(r.to_xy(43.84, 10.5)[0], float)
    # planar distance ~ great-circle time (same units: minutes)
    d = r.distances()
    assert abs(math.hypot(r.x[1] - r.x[0], r.y[1] - r.y[0]) - d[0, 1]) < 0.02
    # a tourist starting at the Cathedral: 0 minutes to it, its own row to the others
    at = np.array([[r.x[1], r.y[1]]])
    k = r.distances(at)[0]
    assert k[0, 1] == 0 and k[0, 2] == d[1, 2] and k[5, -1] == d[5, 1]
    xy = build_custom_region("grid", FIX / "grid.csv")
    assert xy.coords == "xy" and xy.lat is None and xy.metric == "euclidean"
    with pytest.raises(ValueError, match="x/y"):
        xy.to_xy(1.0, 2.0)
    with pytest.raises(ValueError, match="x/y"):
        xy.to_latlon(1.0, 2.0)


def test_region_json_round_trip_keeps_custom_fields():
    """The region bundled with an MLflow model (optw.tracking.pyfunc's region.json) keeps the
    custom fields: names, lat/lon, projection, matrix and so the same travel times."""
    from optw.tracking.pyfunc import region_from_json, region_to_json

    for r in (build_custom_region("town", FIX / "town.csv"),
              build_custom_region("grid", FIX / "grid.csv", FIX / "grid_matrix.csv")):
        back = region_from_json(region_to_json(r))
        assert back.names == r.names and isinstance(back.names, tuple)
        assert back.origin == r.origin and back.coords == r.coords
        np.testing.assert_array_equal(back.distances(), r.distances())
        starts = np.array([[1.0, 2.0], [r.x[3], r.y[3]]])
        np.testing.assert_array_equal(back.distances(starts), r.distances(starts))


def test_matrix_is_used_exactly(cat_dir):
    """With --travel-times the point-to-point times are the matrix's; a start on a point takes
    its row and column; other starts (the depot is not in the matrix) use Euclidean times
    rounded down."""
    add_region("grid", FIX / "grid.csv", FIX / "grid_matrix.csv", catalog=cat_dir)
    r = Catalog(cat_dir).region("grid")
    rows = list(csv.reader((FIX / "grid_matrix.csv").open()))
    m = np.array([[float(v) for v in row[1:]] for row in rows[1:]])
    assert rows[0][1:] == list(r.names[1:-1])
    d = r.distances()
    np.testing.assert_array_equal(d[1:-1, 1:-1], m)
    assert d[0, 1] == 10.0 and d[1, -1] == 10.0  # depot (50, 50) -> A (60, 50): Euclidean
    assert d[0, 2] == 12.0
    k = r.distances(np.array([[60.0, 50.0], [50.5, 50.5]]))
    np.testing.assert_array_equal(k[0, 0, 1:-1], m[0])  # at A: A's matrix row
    np.testing.assert_array_equal(k[0, 1:-1, -1], m[:, 0])
    assert k[1, 0, 1] == math.floor(math.hypot(9.5, 0.5) * 100) / 100


def test_latlon_matrix_and_a_start_given_as_lat_lon(tmp_path):
    """Lat/lon with a matrix labelled by node index (asymmetric, start place included): the
    matrix is used between places, and a start given as a place's lat/lon (the planner's
    to_xy) takes that place's exact row and column; other starts use great-circle times."""
    base = build_custom_region("town", FIX / "town.csv")
    n = base.n_nodes - 1  # places: start + 10 points
    m = base.distances()[:n, :n] + 1.0 + 0.25 * np.triu(np.ones((n, n)), 1)  # asymmetric
    np.fill_diagonal(m, 0.0)
    lines = ["from," + ",".join(str(i) for i in range(n))]
    lines += [f"{i}," + ",".join(f"{v:.2f}" for v in m[i]) for i in range(n)]
    (tmp_path / "m.csv").write_text("\n".join(lines) + "\n")
    r = build_custom_region("town", FIX / "town.csv", tmp_path / "m.csv")
    d = r.distances()
    np.testing.assert_allclose(d[:n, :n], m, atol=1e-9)
    np.testing.assert_allclose(d[1:n, -1], m[1:, 0], atol=1e-9)  # back to the start place
    x, y = r.to_xy(r.lat[4], r.lon[4])
    k = r.distances(np.array([[x, y], [x + 0.5, y]]))
    np.testing.assert_allclose(k[0, 0, 1:n], m[4, 1:], atol=1e-9)
    np.testing.assert_allclose(k[0, 1:n, -1], m[1:, 4], atol=1e-9)
    lat, lon = r.to_latlon(x + 0.5, y)
    from optw.catalog.region import haversine_km

    hand = haversine_km(lat, lon, r.lat[4], r.lon[4]) * 60 / 4.5
    assert k[1, 0, 4] == math.floor(hand * 100 + 1e-7) / 100 and abs(hand - 0.5) < 0.01


def test_validation_tourists_are_reproducible(cat_dir, tmp_path, base_catalog):
    """Validation tourists use the built-in seeding (seed 2925, a stream per region id), the
    region's own box for starts and scores around the default scores; two catalogs agree."""
    add_region("town", FIX / "town.csv", catalog=cat_dir)
    other = tmp_path / "other"
    shutil.copytree(base_catalog, other)
    add_region("town", FIX / "town.geojson", catalog=other)
    a, b = Catalog(cat_dir).validation("town"), Catalog(other).validation("town")
    for k in ("start_xy", "t_start", "t_end", "scores"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
    region = Catalog(cat_dir).region("town")
    fresh = validation_tourists(region)
    np.testing.assert_array_equal(fresh.scores, a.scores)
    assert region.default_score_kind == "around_default"
    (x_lo, x_hi), (y_lo, y_hi) = region.start_box
    assert (x_lo, x_hi) == (region.x.min(), region.x.max())
    assert np.all((a.start_xy[:, 0] >= x_lo) & (a.start_xy[:, 0] <= x_hi))
    assert np.all((a.start_xy[:, 1] >= y_lo) & (a.start_xy[:, 1] <= y_hi))
    pts = a.scores[:, 1:-1]
    assert pts.min() >= 1 and pts.max() <= 1.1 * region.s_max_benchmark
    assert np.corrcoef(pts.mean(0), region.score[1:-1])[0, 1] > 0.9  # around the defaults
    assert np.all(a.t_end > a.t_start)


def test_env_ils_and_greedy_decode_run_and_validate(cat_dir):
    """Env, ILS and greedy decoding run on lat/lon and matrix custom regions; every route
    passes the independent validator."""
    from optw.baselines.ils import solve_ils
    from optw.decode.solve import solve
    from optw.env.instances import make_instances
    from optw.env.validate import check_route
    from optw.model import ModelConfig, PointerNet

    add_region("town", FIX / "town.csv", catalog=cat_dir)
    add_region("grid", FIX / "grid.csv", FIX / "grid_matrix.csv", catalog=cat_dir)
    cat = Catalog(cat_dir)
    model = PointerNet(ModelConfig()).eval()
    for rid in ("town", "grid"):
        region, val = cat.region(rid), cat.validation(rid)[:8]
        inst = make_instances(region, val)
        assert inst.dist_u.shape == (8, region.n_nodes, region.n_nodes)
        assert float(inst.static[..., 0].abs().max()) < 1.0  # coordinates in model range
        scores = []
        for i in range(4):
            res = solve_ils(region, val, i)
            check = check_route(region, res.route, val, i, res.score)
            assert check.ok, check.problems
            scores.append(res.score)
        assert sum(scores) > 0
        bench = solve_ils(region)
        assert check_route(region, bench.route).ok and len(bench.route) > 3
        for sol, i in zip(solve(model, region, val, method="greedy"), range(8), strict=True):
            assert check_route(region, sol.route, val, i, sol.score).ok


# ----------------------------------------------------------------------------- bad input


def _rows() -> list[dict]:
    return list(csv.DictReader((FIX / "town.csv").open()))


def _write_csv(path: Path, rows: list[dict], columns: list[str] | None = None) -> Path:
    columns = columns or list(rows[0])
    buf = io.StringIO()
    w = csv.DictWriter(buf, columns, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    path.write_text(buf.getvalue())
    return path


def _edit(row: int, **values):
    """Points file = town.csv with data row ``row`` (1-based) changed."""
    def make(tmp: Path) -> dict:
        rows = _rows()
        rows[row - 1].update(values)
        return {"points": _write_csv(tmp / "bad.csv", rows)}
    return make


def _geo(edit):
    def make(tmp: Path) -> dict:
        doc = json.loads((FIX / "town.geojson").read_text())
        edit(doc)
        (tmp / "bad.geojson").write_text(json.dumps(doc))
        return {"points": tmp / "bad.geojson"}
    return make


def _matrix(edit):
    def make(tmp: Path) -> dict:
        rows = list(csv.reader((FIX / "grid_matrix.csv").open()))
        rows = edit(rows)
        (tmp / "bad_matrix.csv").write_text("\n".join(",".join(r) for r in rows) + "\n")
        return {"points": FIX / "grid.csv", "travel_times": tmp / "bad_matrix.csv"}
    return make


def _xy_mixed_feature(doc):
    f = doc["features"][3]
    f["geometry"] = None
    f["properties"].update(x=1.0, y=2.0)


def _drop_column(col):
    def make(tmp: Path) -> dict:
        rows = _rows()
        return {"points": _write_csv(tmp / "bad.csv", rows, [c for c in rows[0] if c != col])}
    return make


def _header_extra(tmp: Path) -> dict:
    rows = [{**r, "x": "1", "y": "2"} for r in _rows()]
    return {"points": _write_csv(tmp / "bad.csv", rows)}


def _few(tmp: Path) -> dict:
    return {"points": _write_csv(tmp / "bad.csv", _rows()[:2])}


def _txt(tmp: Path) -> dict:
    shutil.copy(FIX / "town.csv", tmp / "bad.txt")
    return {"points": tmp / "bad.txt"}


def _long_row(tmp: Path) -> dict:
    text = (FIX / "town.csv").read_text().splitlines()
    text[3] += ",extra"
    (tmp / "bad.csv").write_text("\n".join(text) + "\n")
    return {"points": tmp / "bad.csv"}


def _drop_h(rows):
    return [[c for j, c in enumerate(r) if j != 8] for i, r in enumerate(rows) if i != 8]


def _grid_edit(row: int, **values):
    """Points file = grid.csv (x/y minutes) with data row ``row`` (1-based) changed."""
    def make(tmp: Path) -> dict:
        rows = list(csv.DictReader((FIX / "grid.csv").open()))
        rows[row - 1].update(values)
        return {"points": _write_csv(tmp / "bad.csv", rows)}
    return make


def _geo_text(text: str):
    """A points file ``bad.geojson`` holding ``text`` as is."""
    def make(tmp: Path) -> dict:
        (tmp / "bad.geojson").write_text(text)
        return {"points": tmp / "bad.geojson"}
    return make


def _header_only(tmp: Path) -> dict:
    header = (FIX / "town.csv").read_text().splitlines()[0]
    path = tmp / "header_only.csv"
    path.write_text(header + "\n\n")
    return {"points": path}


def _ok(**kw):
    return lambda tmp: {"points": FIX / "town.csv", **kw}


#: case -> (make inputs, expected row (None: whole file), field, text in the message)
BAD = {
    "missing value": (_edit(2, visit_minutes=""), 2, "visit_minutes", "missing value"),
    "non-numeric": (_edit(3, score="lots"), 3, "score", "non-numeric"),
    "negative duration": (_edit(4, visit_minutes="-5"), 4, "visit_minutes", "negative"),
    "negative score": (_edit(5, score="-1"), 5, "score", "negative score"),
    "closing before opening": (_edit(2, opens="17:00", closes="09:30"), 2, "closes",
                               "before opening"),
    "bad clock time": (_edit(6, opens="25:99"), 6, "opens", "bad time"),
    "negative time": (_edit(6, opens="-10"), 6, "opens", "negative time"),
    "duplicate name": (_edit(4, name="cathedral"), 4, "name", "duplicate name"),
    "reserved name": (_edit(4, name="End"), 4, "name", "reserved"),
    "missing name": (_edit(5, name=""), 5, "name", "missing name"),
    "too few points": (_few, None, None, "at least 3"),
    "header and no rows": (_header_only, None, None, "has a header but no rows"),
    "unreachable far away": (_edit(7, lat="44.5"), 7, "closes", "no tourist can visit"),
    "unreachable too late": (_edit(11, closes="09:01"), 11, "closes", "Market Hall"),
    "bad latitude": (_edit(3, lat="95"), 3, "lat", "outside [-90, 90]"),
    "bad longitude": (_edit(3, lon="200"), 3, "lon", "outside [-180, 180]"),
    "mixed columns": (_header_extra, None, "x", "mixed coordinates"),
    "mixed geojson": (_geo(_xy_mixed_feature), 4, "x", "mixed coordinates"),
    "geojson not a collection": (_geo(lambda d: d.update(type="Feature")), None, "type",
                                 "FeatureCollection"),
    "geojson bad geometry": (_geo(lambda d: d["features"][2].update(
        geometry={"type": "LineString", "coordinates": [[0, 0], [1, 1]]})), 3, "geometry",
        "Point"),
    "missing column": (_drop_column("score"), None, "score", "missing column"),
    "start with a score": (_edit(1, score="5"), 1, "score", "start (= end) place"),
    "day ends before it starts": (_edit(1, closes="08:00"), 1, "closes", "not after"),
    "row too long": (_long_row, 3, None, "cells"),
    "unknown file type": (_txt, None, None, "unknown file type"),
    "matrix unknown name": (_matrix(lambda r: [r[0][:1] + ["Z"] + r[0][2:]] + r[1:]), None, "Z",
                            "unknown place"),
    "matrix unknown row": (_matrix(lambda r: r[:2] + [["Q"] + r[2][1:]] + r[3:]), 2, "from",
                           "unknown place"),
    "matrix not square": (_matrix(lambda r: r[:-1]), None, None, "not square"),
    "matrix short row": (_matrix(lambda r: r[:3] + [r[3][:-1]] + r[4:]), 3, None,
                         "not square"),
    "matrix negative": (_matrix(lambda r: r[:2] + [r[2][:3] + ["-3"] + r[2][4:]] + r[3:]), 2,
                        "C", "negative travel time"),
    "matrix non-numeric": (_matrix(lambda r: r[:2] + [r[2][:3] + ["x"] + r[2][4:]] + r[3:]), 2,
                           "C", "non-numeric"),
    "matrix missing point": (_matrix(_drop_h), None, None, "'H'"),
    # every number that enters is finite and bounded; deep or huge JSON is named
    "huge x": (_grid_edit(3, x="1e300"), 3, "x", "outside [-100000, 100000]"),
    "huge y": (_grid_edit(2, y="-2e5"), 2, "y", "outside"),
    "huge visit": (_edit(2, visit_minutes="1e9"), 2, "visit_minutes", "longer than 2879"),
    "huge score": (_edit(3, score="1e308"), 3, "score", "above 1e+09"),
    "matrix huge": (_matrix(lambda r: r[:2] + [r[2][:3] + ["1e308"] + r[2][4:]] + r[3:]), 2,
                    "C", "above 100000 minutes"),
    "matrix overflow": (_matrix(lambda r: r[:2] + [r[2][:3] + ["1e999"] + r[2][4:]] + r[3:]),
                        2, "C", "non-finite"),
    "geojson nested 100k deep": (_geo_text("[" * 100_000 + "]" * 100_000), None, None,
                                 "nested too deeply"),
    "geojson 5000-digit number": (_geo_text((FIX / "town.geojson").read_text().replace(
        '"coordinates": [', '"coordinates": [' + "9" * 5000 + ", ", 1)), None, None,
        "cannot read the JSON"),
    "geojson nested coordinate": (_geo(lambda d: d["features"][2]["geometry"].update(
        coordinates=[[[[[[[[1]]]]]]], 1])), 3, "lon", "expected a number"),
    "matrix diagonal": (_matrix(lambda r: r[:1] + [r[1][:1] + ["4"] + r[1][2:]] + r[2:]), 1,
                        "A", "to itself"),
}
OPTION_ERRORS = {
    "benchmark id": ({"region": "c101"}, "region", "clashes"),
    "benchmark-like id": ({"region": "pr42"}, "region", "clashes"),
    "unsafe id": ({"region": "My City!"}, "region", "safe identifier"),
    "benchmark group": ({"group": "solomon"}, "group", "benchmark group"),
    "benchmark group as id": ({"region": "gavalas"}, "region", "is a group name"),
    "default group as id": ({"region": "custom"}, "region", "is a group name"),
    "its own group as id": ({"region": "trips", "group": "trips"}, "region", "is a group name"),
    "region id as group": ({"group": "r199"}, "group", "is a region id"),
    "bad group": ({"group": "Big Group"}, "group", "safe identifier"),
    "speed for x/y": ({"points": FIX / "grid.csv", "speed_kmh": 5.0}, "--speed-kmh", "lat/lon"),
    "zero speed": ({"speed_kmh": 0.0}, "--speed-kmh", "must be in"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_file_row_field_and_leaves_catalog(cat_dir, tmp_path, case):
    """Every bad points or matrix file raises CustomRegionError naming the file, the row (or
    feature) and the field, and leaves every file of the catalog byte-identical."""
    make, row, field, text = BAD[case]
    args = make(tmp_path)
    before = snapshot(cat_dir)
    with pytest.raises(CustomRegionError) as err:
        add_region("town", catalog=cat_dir, **args)
    e, msg = err.value, str(err.value)
    bad_file = args.get("travel_times") if "matrix" in case else args["points"]
    assert bad_file.name in msg and text in msg, msg
    assert (e.row, e.field) == (row, field), msg
    if row is not None:
        assert f"{'feature' if 'geojson' in case else 'row'} {row}" in msg
    if field is not None:
        assert f"field {field!r}" in msg
    assert snapshot(cat_dir) == before
    Catalog(cat_dir)


@pytest.mark.parametrize("case", sorted(OPTION_ERRORS))
def test_bad_options_are_refused_and_leave_catalog(cat_dir, case):
    """A clashing or unsafe region id or group and a bad speed are refused by name; the
    catalog stays byte-identical."""
    kw, field, text = OPTION_ERRORS[case]
    kw = {"region": "town", "points": FIX / "town.csv", **kw}
    before = snapshot(cat_dir)
    with pytest.raises(CustomRegionError) as err:
        add_region(kw.pop("region"), catalog=cat_dir, **kw)
    assert err.value.field == field and text in str(err.value)
    assert snapshot(cat_dir) == before


def test_cli_refuses_group_names_as_ids_and_a_file_without_rows(cat_dir, tmp_path, capsys):
    """`optw catalog add gavalas` (a benchmark group's name), an id equal to a custom group of
    the catalog, and a points CSV with the full header and no rows are refused in one line
    (exit 2) naming the id or the file; the catalog stays byte-identical."""
    before = snapshot(cat_dir)
    cases = [(["gavalas", "--points", str(FIX / "town.csv")], "region id 'gavalas' is a "
              "group name"),
             (["town", "--points", str(_header_only(tmp_path)["points"])],
              "header_only.csv: the file has a header but no rows")]
    for args, text in cases:
        capsys.readouterr()
        assert cli(["catalog", "add", *args, "--catalog", str(cat_dir)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and text in err, err
        assert "missing column" not in err
    assert snapshot(cat_dir) == before
    add_region("town", FIX / "town.csv", group="trips", catalog=cat_dir)
    with pytest.raises(CustomRegionError, match="region id 'trips' is a group name"):
        add_region("trips", FIX / "grid.csv", catalog=cat_dir)


def test_unreachable_lists_every_unreachable_point(tmp_path):
    """The unreachable-point error names the first point's row and lists the others."""
    rows = _rows()
    rows[6]["lat"] = "44.5"
    rows[10]["closes"] = "09:01"
    with pytest.raises(CustomRegionError, match="Also unreachable: 'Market Hall' \\(row 11\\)"):
        build_custom_region("town", _write_csv(tmp_path / "p.csv", rows))


# ----------------------------------------------------------------------------- add / remove


def _ils_store(cat_dir: Path, regions: list[str]) -> Path:
    """A stored ILS file stamped with the catalog's current tourists hash."""
    from optw.baselines.ils import ILS_VERSION
    from optw.baselines.store import SCHEMA

    cat = Catalog(cat_dir)
    n = len(regions)
    table = pa.table({"region": regions, "tourist": list(range(n)), "kind": ["validation"] * n,
                      "score": [1.0] * n, "route": [[0, 1]] * n, "seconds": [0.1] * n,
                      "iterations": [1] * n, "ils_version": [ILS_VERSION] * n}, schema=SCHEMA)
    table = table.replace_schema_metadata(
        {ILS_TOURISTS_META: cat.manifest["files"]["tourists.parquet"].encode()})
    path = cat_dir / "baselines" / "ils.parquet"
    path.parent.mkdir(exist_ok=True)
    pq.write_table(table, path)
    return path


def test_ils_meta_key_is_the_baseline_stores():
    """The catalog re-stamps ILS stores with the same metadata key they are written with."""
    from optw.baselines import store

    assert store._META_KEY == ILS_TOURISTS_META


def test_re_add_needs_replace_and_drops_stale_ils(cat_dir):
    """Re-adding needs replace=True (else refused, catalog unchanged); the replaced region's
    ILS rows are dropped, the other regions' rows stay current (re-stamped)."""
    add_region("town", FIX / "town.csv", catalog=cat_dir)
    ils = _ils_store(cat_dir, ["r199", "town", "town"])
    before = snapshot(cat_dir)
    with pytest.raises(CustomRegionError, match="--replace"):
        add_region("town", FIX / "town.geojson", catalog=cat_dir)
    assert snapshot(cat_dir) == before
    add_region("town", FIX / "town.geojson", catalog=cat_dir, replace=True, speed_kmh=5.0)
    cat = Catalog(cat_dir)
    assert cat.region("town").speed_kmh == 5.0
    assert not (cat_dir / "custom" / "town" / "points.csv").exists()
    table = pq.read_table(ils)
    assert table["region"].to_pylist() == ["r199"]
    assert table.schema.metadata[ILS_TOURISTS_META].decode() == \
        cat.manifest["files"]["tourists.parquet"]
    from optw.baselines.store import load_ils_results

    assert load_ils_results(cat_dir)["region"].tolist() == ["r199"]


def test_remove(cat_dir):
    """Removing a custom region restores the catalog's regions and tables and deletes its
    sources and ILS rows; benchmark and unknown regions are refused, the catalog untouched."""
    tables = {n: pq.read_table(cat_dir / n) for n in ("regions.parquet", "nodes.parquet",
                                                      "tourists.parquet")}
    add_region("town", FIX / "town.csv", catalog=cat_dir)
    ils = _ils_store(cat_dir, ["town", "r199"])
    before = snapshot(cat_dir)
    for rid, text in (("r199", "benchmark region"), ("nowhere", "unknown region")):
        with pytest.raises(CustomRegionError, match=text):
            remove_region(rid, cat_dir)
        assert snapshot(cat_dir) == before
    remove_region("town", cat_dir)
    cat = Catalog(cat_dir)
    assert "town" not in cat and not (cat_dir / "custom" / "town").exists()
    assert "town" not in cat.manifest["custom_regions"] and "custom" not in cat.manifest["groups"]
    for n, t in tables.items():
        assert pq.read_table(cat_dir / n).equals(t), n
    assert pq.read_table(ils)["region"].to_pylist() == ["r199"]
    assert not [p for p in cat_dir.iterdir() if p.name.startswith(".build-")]


def test_rebuild_keeps_custom_regions(cat_dir, source_dir):
    """`optw catalog build` re-adds the stored custom regions with the same tables (the
    tourist file's hash is unchanged, so stored ILS results stay current)."""
    add_region("town", FIX / "town.csv", catalog=cat_dir)
    add_region("grid", FIX / "grid.csv", FIX / "grid_matrix.csv", group="mygroup",
               catalog=cat_dir)
    old = Catalog(cat_dir)
    files = dict(old.manifest["files"])
    build_catalog(source_dir, cat_dir)
    new = Catalog(cat_dir)
    assert new.list_regions() == ["r199", "pr99", "t199", "grid", "town"]
    assert new.manifest["files"] == files
    assert new.list_regions(group="mygroup") == ["grid"]
    np.testing.assert_array_equal(new.region("grid").distances(), old.region("grid").distances())
    np.testing.assert_array_equal(new.validation("town").scores, old.validation("town").scores)
    assert new.manifest["custom_regions"]["grid"]["travel_times_file"] == "travel_times.csv"
    # the pyarrow-only reader (stand-alone paper-set generator) reads custom regions too
    grid = next(r for r in read_regions(cat_dir) if r.id == "grid")
    np.testing.assert_array_equal(grid.distances(), old.region("grid").distances())
    town = next(r for r in read_regions(cat_dir) if r.id == "town")
    assert town.names == old.region("town").names and town.origin == old.region("town").origin


def test_old_catalog_version_is_refused(cat_dir):
    """A catalog of the previous version is refused with the rebuild message, by add too."""
    manifest = json.loads((cat_dir / "manifest.json").read_text())
    manifest["catalog_version"] = 1
    (cat_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CatalogError, match="catalog_version 1.*optw catalog build"):
        add_region("town", FIX / "town.csv", catalog=cat_dir)


def test_paper_set_of_a_custom_region_is_a_clear_error(cat_dir):
    """Custom regions have no paper set: asking for one says so."""
    add_region("town", FIX / "town.csv", catalog=cat_dir)
    with pytest.raises(CatalogError):
        Catalog(cat_dir).tourists("town", "paper")


def test_cli_add_show_remove(cat_dir, capsys):
    """`optw catalog add|show|list|remove` work on a custom region; errors are one line with
    exit code 2."""
    assert cli(["catalog", "add", "town", "--points", str(FIX / "town.csv"),
                "--catalog", str(cat_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["region"] == "town" and out["validation_tourists"] == 64
    assert out["coords"] == "latlon" and out["speed_kmh"] == 4.5
    assert cli(["catalog", "show", "town", "--catalog", str(cat_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["start_name"] == "Station Square"
    assert cli(["catalog", "list", "--group", "custom", "--catalog", str(cat_dir)]) == 0
    assert "town" in capsys.readouterr().out
    assert cli(["catalog", "add", "town", "--points", str(FIX / "town.csv"),
                "--catalog", str(cat_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("optw catalog add: error:") and "--replace" in err
    assert cli(["catalog", "remove", "town", "--catalog", str(cat_dir)]) == 0
    assert cli(["catalog", "remove", "t199", "--catalog", str(cat_dir)]) == 2


def test_cli_add_prints_what_the_readme_shows_and_show_speaks_lat_lon(cat_dir, capsys):
    """`catalog add` prints "Added region ..." (as README shows); `catalog show` of
    a lat/lon region prints the start as lat/lon and the day and tourists' times as clock
    times, not projected x/y and minutes; `--json` is valid JSON (no Infinity/NaN)."""
    from optw.catalog.cli import dumps

    assert cli(["catalog", "add", "town", "--points", str(FIX / "town.csv"),
                "--catalog", str(cat_dir)]) == 0
    assert capsys.readouterr().out.startswith("Added region town (group custom): 10 points")
    assert cli(["catalog", "show", "town", "--catalog", str(cat_dir)]) == 0
    out = capsys.readouterr().out
    first = _rows()[0]
    assert f"start_latlon: {float(first['lat']):.6f}, {float(first['lon']):.6f}" in out
    assert "day: 09:00-18:00" in out and "t_start:" not in out
    assert re.search(r"validation tourists: 64; start min/median/max \d\d:\d\d", out), out
    assert cli(["catalog", "show", "town", "--catalog", str(cat_dir), "--json"]) == 0

    def no_constants(name):
        raise AssertionError(f"{name} is not JSON")

    shown = json.loads(capsys.readouterr().out, parse_constant=no_constants)
    assert shown["start_latlon"] == [float(first["lat"]), float(first["lon"])]
    assert shown["day"] == "09:00-18:00"
    assert dumps({"a": [float("inf"), float("nan"), 1.5]}) == '{"a": [null, null, 1.5]}'


def test_cli_refuses_unbounded_numbers_in_one_line(cat_dir, tmp_path, capsys):
    """x = 1e300 (once an OverflowError traceback), a travel time of 1e308 (was
    stored as inf and a route across it passed the validator) and a score of 1e308 are
    refused in one line naming the file, row and field; the catalog is untouched."""
    before = snapshot(cat_dir)
    grid = list(csv.DictReader((FIX / "grid.csv").open()))
    grid[2]["x"] = "1e300"
    town = _rows()
    town[2]["score"] = "1e308"
    matrix = list(csv.reader((FIX / "grid_matrix.csv").open()))
    matrix[2][3] = "1e308"
    (tmp_path / "m.csv").write_text("\n".join(",".join(r) for r in matrix) + "\n")
    cases = [
        (["--points", str(_write_csv(tmp_path / "x.csv", grid))], "x.csv, row 3", "'x'"),
        (["--points", str(_write_csv(tmp_path / "s.csv", town))], "s.csv, row 3", "'score'"),
        (["--points", str(FIX / "grid.csv"), "--travel-times", str(tmp_path / "m.csv")],
         "m.csv, row 2", "'C'"),
    ]
    for args, where, field in cases:
        assert cli(["catalog", "add", "big", *args, "--catalog", str(cat_dir)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("optw catalog add: error:") and err.count("\n") == 1, err
        assert where in err and f"field {field}" in err, err
    assert snapshot(cat_dir) == before


def test_an_infinite_travel_time_never_makes_a_route_feasible():
    """A travel time of inf (as 1e308 used to be stored) became INT64_MIN in time
    units and a route across it passed the validator; now converting it is a ValueError, so
    no check or solver sees it as a short edge."""
    import dataclasses

    from optw.catalog import to_time_units
    from optw.env.validate import check_route

    region = build_custom_region("grid", FIX / "grid.csv", FIX / "grid_matrix.csv")
    travel = region.travel.copy()
    travel[2, 1] = np.inf
    broken = dataclasses.replace(region, travel=travel)  # its own cache, not region's
    with pytest.raises(ValueError, match="not finite"):
        check_route(broken, [0, 2, 1, region.n_nodes - 1])
    for bad in (np.inf, -np.inf, np.nan, 1e13):
        with pytest.raises(ValueError, match="minutes"):
            to_time_units([1.0, bad])
    assert to_time_units([1e12, 0.01]).tolist() == [10**14, 1]


def test_worked_example_city(cat_dir):
    """examples/city: the CSV and the GeoJSON hold the same 30-60 places and add cleanly."""
    add_region("city", EXAMPLE / "pois.csv", catalog=cat_dir)
    add_region("city-geo", EXAMPLE / "pois.geojson", catalog=cat_dir)
    cat = Catalog(cat_dir)
    a, b = cat.region("city"), cat.region("city-geo")
    assert 30 <= a.n_points <= 60 and a.coords == "latlon"
    assert a.names == b.names
    np.testing.assert_array_equal(a.distances(), b.distances())
