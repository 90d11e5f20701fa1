"""Region catalog: parsing, Parquet store, tourist generator, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from conftest import (
    assert_names_field,
    bad_tourists,
    good_tourist,
    write_tiny_source,
    write_toptw,
    write_ttdp,
)
from optw.catalog import (
    PAPER_SUBSET,
    TIME_UNITS_PER_MINUTE,
    Catalog,
    CatalogError,
    SourceError,
    TouristError,
    build_catalog,
    open_catalog,
    read_tourist,
    read_tourists,
    round_down,
    sample_tourists,
    to_time_units,
    validation_tourists,
)
from optw.catalog.store import FILES
from optw.catalog.tourist_json import SCORE_LIMIT, start_box
from optw.cli import main as cli


def test_counts_per_group(catalog):
    """The full catalog holds the 109 benchmark regions: 56 Solomon, 20 Cordeau, 33 Gavalas."""
    assert len(catalog) == 109
    assert len(catalog.list_regions("solomon")) == 56
    assert len(catalog.list_regions("cordeau")) == 20
    assert len(catalog.list_regions("gavalas")) == 33
    assert sorted(catalog.list_regions(subset=True)) == sorted(PAPER_SUBSET)
    assert catalog.list_regions(["cordeau"], subset=True) == [
        "pr01", "pr02", "pr03", "pr04", "pr11", "pr12", "pr13", "pr14"]


def test_known_values(catalog):
    """Known facts of c101, t101 and pr01 and the points-per-region ranges per group."""
    c101 = catalog.region("c101")
    assert (c101.n_points, c101.t_start, c101.t_end) == (100, 0.0, 1236.0)
    t101 = catalog.region("t101")
    assert (t101.n_points, t101.t_start, t101.t_end) == (101, 510.0, 1210.0)
    assert catalog.region("pr01").n_points == 48
    df = catalog.regions_table
    by_group = df.groupby("group")["points"].agg(["min", "max"])
    assert tuple(by_group.loc["solomon"]) == (100, 100)
    assert by_group.loc["cordeau", "min"] >= 48 and by_group.loc["cordeau", "max"] <= 288
    assert by_group.loc["gavalas", "min"] >= 101 and by_group.loc["gavalas", "max"] <= 200
    # normalisers as the published checkpoints define them
    assert t101.t_day == 1439 and t101.t_max == max(1439, 1210 + np.floor(1439 * 4 / 24))
    assert t101.s_max == round(1.1 * t101.score.max())


def test_end_node_is_a_copy_of_the_start(catalog):
    """Node n-1 repeats the start's place and window, with duration and score 0."""
    for rid in ("c101", "pr01", "t101"):
        r = catalog.region(rid)
        assert r.n_nodes == r.n_points + 2
        for arr in (r.x, r.y, r.opening, r.closing):
            assert arr[0] == arr[-1]
        assert r.duration[0] == r.duration[-1] == 0 and r.score[0] == r.score[-1] == 0
        assert r.opening[0] == r.t_start and r.closing[-1] == r.t_end
        d = r.distances()
        assert d[0, -1] == 0 and np.array_equal(d[0], d[-1])


@pytest.mark.parametrize("rid,decimals", [("c101", 1), ("pr01", 2), ("t101", 2)])
def test_distance_rounding(catalog, rid, decimals):
    """Distances are Euclidean rounded DOWN to 1 (Solomon) or 2 (Cordeau, Gavalas) decimals."""
    r = catalog.region(rid)
    assert r.decimals == decimals
    d = r.distances()
    xy = np.stack([r.x, r.y], 1)
    exact = np.sqrt(((xy[:, None] - xy[None]) ** 2).sum(-1))
    assert np.all(d <= exact + 1e-9) and np.all(exact - d < 10.0**-decimals + 1e-9)
    assert np.allclose(d * 10**decimals, np.round(d * 10**decimals))
    if rid == "c101":  # (40,50)->(45,68): sqrt(349) = 18.68.. -> 18.6
        assert d[0, 1] == pytest.approx(18.6)
    assert round_down(np.array([2.0, 1.999999999999]), 1).tolist() == [2.0, 2.0]


def test_distances_for_a_moved_start(catalog):
    """Moving the start changes only the start/end rows and columns of the distance matrix."""
    r = catalog.region("pr01")
    xy = np.array([[10.0, -20.0], [0.0, 0.0]])
    d = r.distances(xy)
    assert d.shape == (2, r.n_nodes, r.n_nodes)
    base = r.distances()
    assert np.array_equal(d[:, 1:-1, 1:-1], np.broadcast_to(base[1:-1, 1:-1], (2, 48, 48)))
    expect = round_down(np.hypot(r.x[5] - 10.0, r.y[5] + 20.0), 2)
    assert d[0, 0, 5] == d[0, 5, -1] == expect


def test_many_tourists_distances_warn_and_come_in_chunks(catalog, monkeypatch):
    """`region.distances` for 10,000 t101 tourists allocates ~830 MB; past
    DISTANCES_WARN_BYTES it says so (RuntimeWarning naming iter_distances), and
    `iter_distances` yields the same arrays in bounded chunks."""
    import warnings

    from optw.catalog import region as region_module

    r = catalog.region("t101")
    xy = sample_tourists(r, 10, rng=0).start_xy
    monkeypatch.setattr(region_module, "DISTANCES_WARN_BYTES", 8 * 5 * r.n_nodes**2)
    with pytest.warns(RuntimeWarning, match="iter_distances"):
        whole = r.distances(xy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r.distances(xy[:5])  # at the limit: silent
        parts = list(r.iter_distances(xy, chunk=4))
    assert [p.stop - p.start for p, _ in parts] == [4, 4, 2]
    assert np.array_equal(np.concatenate([d for _, d in parts]), whole)
    assert 8 * 10_000 * r.n_nodes**2 > 800e6  # the case: ~830 MB
    with pytest.raises(ValueError, match="chunk"):
        next(r.iter_distances(xy, chunk=0))


def test_catalog_build_refuses_a_bogus_device_and_an_out_file(tmp_path, capsys):
    """`catalog build --device bogus` (once silently ignored) names --device and its
    values; --device without --paper-sets says it does nothing; `--out FILE` (once a raw
    `[Errno 17] File exists`) is one line naming --out; the file is untouched."""
    src = write_tiny_source(tmp_path / "src")
    afile = tmp_path / "cat.txt"
    afile.write_text("mine")
    cases = [
        (["--device", "bogus", "--paper-sets"], "--device 'bogus': expected one of auto, cpu"),
        (["--device", "cuda:x", "--paper-sets"], "--device 'cuda:x'"),
        (["--device", "cpu"], "--device cpu: only --paper-sets"),
        (["--out", str(afile)], f"--out {afile}: is a file"),
    ]
    for args, text in cases:
        argv = ["catalog", "build", "--source", str(src), "--quiet", *args]
        if "--out" not in args:
            argv += ["--out", str(tmp_path / "c")]
        assert cli(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"optw catalog build: error: {text}") and err.count("\n") == 1
    assert afile.read_text() == "mine" and not (tmp_path / "c").exists()
    from optw.outdir import OutDirError

    with pytest.raises(OutDirError, match="is a file, not a catalog folder"):
        build_catalog(src, afile)


def test_stored_tourists(catalog):
    """Each region has its benchmark tourist (id 0) and 64 fixed validation tourists (1..64)."""
    r = catalog.region("t101")
    b = catalog.benchmark("t101")
    assert len(b) == 1 and b.t_start[0] == 510 and np.array_equal(b.scores[0], r.score)
    v = catalog.validation("t101")
    assert len(v) == 64 and v.tourist_id.tolist() == list(range(1, 65))
    again = validation_tourists(r)
    assert np.array_equal(v.scores, again.scores) and np.array_equal(v.t_end, again.t_end)


@pytest.mark.parametrize("rid", ["c101", "pr01", "t101", "rc201"])
def test_generator_ranges(catalog, rid):
    """Generated tourists follow the paper's ranges for place, times and scores."""
    r = catalog.region(rid)
    g = sample_tourists(r, 5000, rng=7)
    lo, hi = (-100, 100) if r.group == "cordeau" else (0, 100)
    assert g.start_xy.min() >= lo and g.start_xy.max() <= hi
    h = 24 / r.t_day
    ts, te = g.t_start * h, g.t_end * h
    tol = h  # rounding to whole minutes moves a value by at most half a minute
    assert ts.min() >= r.t_start * h - 4 - tol
    assert ts.max() <= min(15, r.t_end * h + 4) + tol
    assert np.all(te >= np.maximum(12, ts + 4) - 2 * tol)
    assert te.max() <= r.t_end * h + 4 + tol
    assert np.all(g.t_start == np.round(g.t_start)) and np.all(g.t_end > g.t_start)
    # T_max bounds every generated time stamp (to the minute: its 4 hours are floored)
    assert te.max() <= (r.t_max + 1) * h + tol
    pts = g.scores[:, 1:-1]
    assert pts.min() >= 1 and pts.max() <= 1.1 * r.s_max_benchmark
    assert np.all(g.scores[:, 0] == 0) and np.all(g.scores[:, -1] == 0)


def test_gavalas_scores_correlate_with_durations(catalog):
    """Correlated scores follow N(S_max·d/d_max, 10²): strongly correlated with durations
    (means match within sampling error); uniform scores are not correlated."""
    r = catalog.region("t101")
    g = sample_tourists(r, 4000, rng=11, score_kind="correlated")
    d = np.broadcast_to(r.duration[1:-1], g.scores[:, 1:-1].shape).ravel()
    s = g.scores[:, 1:-1].ravel()
    rho, p = stats.pearsonr(d, s)
    assert rho > 0.5 and p < 1e-12
    # away from the clipping bounds the per-point mean is the paper's S_max·d/d_max
    mean = r.s_max_benchmark * r.duration[1:-1] / r.duration[1:-1].max()
    inside = (mean > 40) & (mean < 1.1 * r.s_max_benchmark - 40)
    if inside.any():
        err = np.abs(g.scores[:, 1:-1].mean(0)[inside] - mean[inside])
        assert err.max() < 5 * 10 / np.sqrt(4000) + 0.5
    u = sample_tourists(r, 4000, rng=11, score_kind="uniform")
    rho_u, _ = stats.pearsonr(d, u.scores[:, 1:-1].ravel())
    assert abs(rho_u) < 0.05


def test_generator_determinism_and_speed(catalog):
    """Same seed, same tourists; different seeds differ; sampling is vectorised (fast)."""
    import time

    r = catalog.region("c101")
    a, b = sample_tourists(r, 100, rng=3), sample_tourists(r, 100, rng=3)
    assert np.array_equal(a.scores, b.scores) and np.array_equal(a.start_xy, b.start_xy)
    c = sample_tourists(r, 100, rng=4)
    assert not np.array_equal(a.scores, c.scores)
    t0 = time.perf_counter()
    sample_tourists(r, 5000, rng=0)
    assert time.perf_counter() - t0 < 2.0  # thousands per second, with a wide margin
    with pytest.raises(ValueError, match="score kind"):
        sample_tourists(r, 3, rng=0, score_kind="zipf")


def test_catalog_list_json(catalog, capsys):
    """`optw catalog list --json` prints one object per region with the documented keys."""
    assert cli(["catalog", "list", "--json", "--group", "gavalas"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 33
    assert {"region", "group", "points", "t_start", "t_end", "validation_tourists"} <= set(rows[0])
    assert cli(["catalog", "show", "c101"]) == 0
    assert "c101" in capsys.readouterr().out
    assert cli(["catalog", "show", "c1011"]) == 2
    assert "unknown region" in capsys.readouterr().err


def test_unknown_region_and_group(catalog):
    """Unknown ids or groups raise errors that name them."""
    with pytest.raises(KeyError, match="c999"):
        catalog.region("c999")
    with pytest.raises(ValueError, match="europe"):
        catalog.list_regions("europe")


# ----------------------------------------------------------------------------- bad input


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _corrupt_line(path: Path, lineno: int, new: str | None) -> None:
    lines = path.read_text().splitlines()
    if new is None:
        del lines[lineno - 1]
    else:
        lines[lineno - 1] = new
    path.write_text("\n".join(lines) + "\n")


BAD_CASES = {
    "wrong vertex count": ("solomon/r199.txt", 1, "1 1 11 1", "11 vertices"),
    "short row": ("solomon/r199.txt", 5, "2 10.0 10.0 5.00", "fields"),
    "non-numeric row": ("cordeau/pr99.txt", 6, "3 1.0 abc 5 5 1 1 1 10 50", "non-numeric"),
    "opening after closing": ("solomon/r199.txt", 4, "1 5.0 5.0 5.00 5.00 1 1 1 90 80",
                              "opening time 90 is after closing time 80"),
    "negative duration": ("cordeau/pr99.txt", 4, "1 5.0 5.0 -3 5 1 1 1 10 80",
                          "negative visit duration"),
    "multi-day gavalas": ("gavalas/t199.txt", 1, "20 2 2 12 9 250" + " 10" * 10,
                          "multi-day"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_source_leaves_previous_catalog(tmp_path, case):
    """A malformed file stops the build with file, line and problem; the catalog is untouched."""
    src = write_tiny_source(tmp_path / "src")
    out = tmp_path / "catalog"
    build_catalog(src, out)
    before = _snapshot(out)
    rel, lineno, new, message = BAD_CASES[case]
    _corrupt_line(src / rel, lineno, new)
    with pytest.raises(SourceError) as err:
        build_catalog(src, out)
    text = str(err.value)
    assert Path(rel).name in text and message in text
    if case != "wrong vertex count":
        assert f":{lineno}:" in text
    assert _snapshot(out) == before
    assert not [p for p in out.iterdir() if p.name.startswith(".build-")]
    Catalog(out)  # still opens


def test_unknown_file_name_is_rejected(tmp_path):
    """A stray instance-like file in a group folder is an error naming it."""
    src = write_tiny_source(tmp_path / "src")
    shutil.copy(src / "solomon" / "r199.txt", src / "solomon" / "foo1.txt")
    with pytest.raises(SourceError, match="foo1.txt"):
        build_catalog(src, tmp_path / "catalog")
    assert not (tmp_path / "catalog" / "manifest.json").exists()


def test_gavalas_day_selects_windows(tmp_path):
    """SD picks the opening/closing pair of that day for every point."""
    path = write_ttdp(tmp_path / "src" / "gavalas" / "t198.txt", 5, seed=9, day=4)
    build_catalog(tmp_path / "src", tmp_path / "cat")
    r = open_catalog(tmp_path / "cat").region("t198")
    fields = path.read_text().splitlines()[2].split()
    assert r.opening[1] == float(fields[6 + 8]) and r.closing[1] == float(fields[7 + 8])
    assert (r.t_start, r.t_end) == (480, 1080)


def test_toptw_parse_keeps_first_fields_and_last_two(tmp_path):
    """TOPTW rows with a longer middle list keep x, y, d, S and the last two fields (O, C)."""
    path = write_toptw(tmp_path / "src" / "cordeau" / "pr98.txt", 3, seed=5)
    lines = path.read_text().splitlines()
    lines[3] = "1 1.5 2.5 7 9 1 4 1 2 4 8 15 99"
    path.write_text("\n".join(lines) + "\n")
    build_catalog(tmp_path / "src", tmp_path / "cat")
    r = open_catalog(tmp_path / "cat").region("pr98")
    assert (r.x[1], r.y[1], r.duration[1], r.score[1], r.opening[1], r.closing[1]) == (
        1.5, 2.5, 7, 9, 15, 99)


def test_old_catalog_version_says_how_to_rebuild(tiny_catalog, tmp_path):
    """Opening a catalog of another version names both versions and the rebuild command."""
    copy = tmp_path / "cat"
    shutil.copytree(tiny_catalog.path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["catalog_version"] = 0
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CatalogError, match="catalog_version 0.*optw catalog build"):
        Catalog(copy)
    (copy / FILES[0]).unlink()
    with pytest.raises(CatalogError):
        Catalog(copy)
    with pytest.raises(CatalogError, match="no region catalog"):
        Catalog(tmp_path / "nowhere")


# ----------------------------------------------------------------------------- tourists as JSON
# good_tourist, bad_tourists and assert_names_field live in conftest.py: the tests of every
# entry point that reads tourists (test_decode, test_tracking, test_serve) share them.


def test_tourist_reader_reads_records_ids_and_both_score_forms(catalog):
    """The one tourist reader takes Tourists.to_records() unchanged (per-node scores, region,
    kind), per-point scores, [x, y] and {x, y} starts and string ids; it builds the same batch
    (positional tourist_id, the given ids kept for output); absent fields take the benchmark's
    values only with defaults; values on the edges of the accepted ranges pass."""
    region = catalog.region("pr01")
    val = catalog.validation("pr01")
    batch = read_tourists(val.to_records(), region)
    for name in ("start_xy", "t_start", "t_end"):
        np.testing.assert_array_equal(getattr(batch.tourists, name), getattr(val, name))
    np.testing.assert_array_equal(batch.tourists.scores[:, 1:-1], val.scores[:, 1:-1])
    assert batch.ids == val.tourist_id.tolist() and batch.tourists.tourist_id.tolist() == list(
        range(len(val)))
    good = good_tourist(region)
    one = read_tourist({**good, "start": {"x": good["start"][0], "y": good["start"][1]}}, region)
    assert one.id == "alice" and one.start_xy == region.start_xy and one.scores.shape == (48,)
    batch = read_tourists([good, {k: v for k, v in good.items() if k != "tourist"}], region)
    assert batch.ids == ["alice", 1] and batch.tourists.kind == "generated"
    (x_lo, x_hi), _ = start_box(region)
    edge = {**good, "start": [x_lo, 0], "t_end": good["t_start"] + 0.01,
            "scores": [0.0] * 47 + [SCORE_LIMIT]}
    assert read_tourist(edge, region).t_end == good["t_start"] + 0.01
    default = read_tourist({}, region, defaults=True)
    assert (default.t_start, default.t_end, default.start_xy) == (
        region.t_start, region.t_end, region.start_xy)
    np.testing.assert_array_equal(default.scores, region.score[1:-1])
    with pytest.raises(TouristError, match="^start: missing"):
        read_tourist({}, region)


@pytest.mark.parametrize("required", [True, False], ids=["required", "defaults"])
def test_tourist_reader_names_the_field_of_each_generated_bad_tourist(tiny_catalog, required):
    """Every tourist of the generated bad family, in each tiny region, fails with a one-line
    TouristError (a ValueError) naming its field; read among others, the error also names the
    tourist's index."""
    for rid in tiny_catalog.list_regions():
        region = tiny_catalog.region(rid)
        good = good_tourist(region)
        for case, bad, field in bad_tourists(region, required):
            with pytest.raises(TouristError) as err:
                read_tourist(bad, region, defaults=not required)
            assert err.value.field == field, (rid, case, str(err.value))
            assert_names_field(str(err.value), field)
            with pytest.raises(ValueError) as err:
                read_tourists([good, bad], region, defaults=not required)
            assert err.value.field == field and err.value.index == 1, (rid, case)
            assert str(err.value).startswith("tourist 1")


def test_to_time_units_matches_the_formula_it_replaced():
    """to_time_units is bit-identical to the rint(minutes * 100) int64 conversion that the
    environment, the validator, ILS and the planner each wrote (halves, negatives, arrays)."""
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.uniform(-2000, 2000, 10_000), np.arange(-5, 5) + 0.005,
                             np.round(rng.uniform(0, 1500, 1000), 2)])
    old = np.rint(np.asarray(values, dtype=np.float64) * TIME_UNITS_PER_MINUTE).astype(np.int64)
    got = to_time_units(values)
    assert got.dtype == np.int64 and np.array_equal(got, old)
    assert to_time_units(12.34).shape == () and int(to_time_units(12.34)) == 1234



def test_load_json_names_the_input_for_deep_huge_or_bad_json():
    """A JSON input nested 100k deep (once a bare `maximum recursion depth
    exceeded`), a 5000-digit integer or bad JSON give one line starting with the file's
    name; a tourist nested deep in a field is described without recursing through it."""
    from optw.catalog.tourist_json import describe, load_json

    where = "tourist file t.json"
    for text, problem in (("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
                          ("[" + "9" * 5000 + "]", "cannot read the JSON"),
                          ('{"start": [1, 2}', "not valid JSON"),
                          (b"\xff\xfe", "not UTF-8")):
        with pytest.raises(ValueError) as err:
            load_json(text, where)
        msg = str(err.value)
        assert msg.startswith(f"{where}: {problem}") and "\n" not in msg, msg
    assert load_json('{"a": [1, 2.5]}') == {"a": [1, 2.5]}
    deep: list = [1]
    for _ in range(5000):
        deep = [deep]
    assert describe(deep).startswith("list [[[")
