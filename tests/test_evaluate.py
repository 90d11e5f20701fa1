"""Evaluation statistics and tables: hand-computed cases, CLI, bad-input errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import copy_catalog
from optw.baselines.store import ILS_VERSION, write_ils_results
from optw.evaluate import (
    ResultsError,
    bootstrap_ci,
    evaluate,
    gap,
    to_markdown,
    validate_results,
    wilcoxon_greater,
    write_tables,
)
from optw.evaluate import tables as tables_mod

# ----------------------------------------------------------------------------- stats


def test_gap_sign_convention():
    """Gap = (baseline - model) / baseline x 100: negative when the model scores higher,
    positive when lower, NaN for a zero baseline."""
    g = gap([100, 100, 200, 0], [110, 90, 200, 5])
    assert g[:3].tolist() == [-10.0, 10.0, 0.0]
    assert np.isnan(g[3])


def test_bootstrap_ci_hand_computed():
    """Two values resample to means {a, (a+b)/2, b} with probability 1/4, 1/2, 1/4, so the
    95% percentile CI is [a, b]; one value or constants give a zero-width interval; the same
    seed gives the same interval."""
    assert bootstrap_ci([-10.0, 5.0]) == (-10.0, 5.0)
    assert bootstrap_ci([3.0]) == (3.0, 3.0)
    assert bootstrap_ci([2.0] * 7) == (2.0, 2.0)
    x = np.random.default_rng(1).normal(size=30)
    assert bootstrap_ci(x, seed=5) == bootstrap_ci(x, seed=5)
    lo, hi = bootstrap_ci(x)
    assert lo < x.mean() < hi
    assert all(np.isnan(bootstrap_ci([])))
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, np.nan])


def test_ci_width_shrinks_with_n():
    """The CI of a mean narrows like 1/sqrt(n) (normal data, sd 1: width ~ 3.92/sqrt(n))."""
    rng = np.random.default_rng(0)
    widths = []
    for n in (10, 100, 1000):
        lo, hi = bootstrap_ci(rng.normal(size=n))
        widths.append(hi - lo)
        assert 0.7 < (hi - lo) / (3.92 / np.sqrt(n)) < 1.3
    assert widths[0] > widths[1] > widths[2]


def test_wilcoxon_direction():
    """One-sided test of "x > y": five positive differences give the exact p = 1/32; the
    reversed comparison is not significant; all-equal pairs give p = 1."""
    y = np.zeros(5)
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.5])
    assert wilcoxon_greater(x, y) == pytest.approx(1 / 32)
    assert wilcoxon_greater(y, x) == pytest.approx(1.0)
    rng = np.random.default_rng(2)
    base = rng.uniform(100, 200, size=40)
    better = base + rng.normal(2.0, 1.0, size=40)
    assert wilcoxon_greater(better, base) < 1e-6
    assert wilcoxon_greater(base, better) > 0.99
    assert wilcoxon_greater([1, 2], [1, 2]) == 1.0
    with pytest.raises(ValueError):
        wilcoxon_greater([1, 2], [1])


def test_markdown_writer():
    """Markdown tables are written without tabulate: header, separator, escaped pipes, '-'
    for missing values."""
    md = to_markdown(pd.DataFrame({"a|b": ["x|y", "z"], "v": [1.5, np.nan]}))
    assert md.splitlines() == ["| a\\|b | v |", "|---|---|", "| x\\|y | 1.50 |", "| z | - |"]


# ----------------------------------------------------------------------------- tables


@pytest.fixture(scope="module")
def cat(catalog):
    """The project's catalog (conftest's ``catalog``)."""
    return catalog


#: (region, tourist, ILS score, model score); tourist 0 is the benchmark tourist.
CASE = [
    ("c101", 0, 100.0, 110.0), ("c102", 0, 200.0, 190.0), ("pr01", 0, 50.0, 50.0),
    ("c101", 1, 10.0, 12.0), ("c101", 2, 20.0, 24.0),
]
BEST_KNOWN = {"c101": 120.0, "c102": 200.0, "pr01": 50.0}


def _case_frames():
    res = pd.DataFrame([{"region": r, "tourist": t, "method": "m", "score": s, "seconds": 0.5}
                        for r, t, _, s in CASE])
    ils = pd.DataFrame([{"region": r, "tourist": t, "kind": "benchmark" if t == 0 else
                         "validation", "score": b, "route": [0], "seconds": 0.01,
                         "iterations": 150, "ils_version": ILS_VERSION} for r, t, b, _ in CASE])
    return res, ils


def test_tables_hand_computed(cat):
    """Group rows average per-region gaps (not gaps of averages); the generated gap uses the
    region's mean over its tourists; best-known gaps only for benchmark tourists."""
    res, ils = _case_frames()
    out = evaluate(validate_results(res, cat), ils, pd.Series(BEST_KNOWN))
    s = out["summary"].set_index(["kind", "group"])
    sol = s.loc[("benchmark", "solomon")]
    assert sol["regions"] == 2
    assert sol["gap_ils"] == pytest.approx(-2.5)  # mean(-10, +5)
    assert (sol["gap_ils_lo"], sol["gap_ils_hi"]) == pytest.approx((-10.0, 5.0))
    assert sol["gap_bk"] == pytest.approx((100 * 10 / 120 + 5.0) / 2)
    assert (sol["best_known"], sol["ils"], sol["model"]) == (160.0, 150.0, 150.0)
    assert s.loc[("benchmark", "cordeau"), "gap_ils"] == 0.0
    gen = s.loc[("validation", "solomon")]
    assert gen["gap_ils"] == pytest.approx(-20.0)  # (15 - 18) / 15
    assert np.isnan(gen["gap_bk"]) and np.isnan(gen["best_known"])
    assert gen["seconds"] == 0.5
    regions = out["regions"].set_index(["kind", "region"])
    assert regions.at[("validation", "c101"), "tourists"] == 2
    p = out["pvalues"]
    row = p[(p["kind"] == "benchmark") & (p["from"] == "ils") & (p["to"] == "m")].iloc[0]
    assert row["regions"] == 3 and row["mean_improvement"] == pytest.approx(0.0)
    with pytest.raises(ResultsError, match="has no rows"):
        validate_results(res.iloc[:0], cat)
    md = tables_mod.render_markdown(out)["summary.md"]
    assert "| Solomon [benchmark] | 2 | 160.00 | 150.00 | 150.00 | -2.50% |" in md


def test_missing_baseline_pairs(cat):
    """Results without a stored ILS result for the same tourist are refused, naming a pair
    and the command that computes it."""
    res, ils = _case_frames()
    with pytest.raises(ValueError, match=r"\(c101, 2\).*optw baseline ils --regions c101"):
        evaluate(validate_results(res, cat), ils.iloc[:-1], None)


def test_write_tables_all_or_nothing(cat, tmp_path, monkeypatch):
    """A failure while writing leaves the output folder exactly as it was (no partial files,
    no temporary folder left behind); a second evaluation replaces its own tables and keeps a
    file the user put beside them; a folder of other files is refused and left alone."""
    from optw.outdir import OutDirError

    res, ils = _case_frames()
    out = evaluate(validate_results(res, cat), ils, pd.Series(BEST_KNOWN))
    dest = tmp_path / "eval"
    write_tables(out, dest)
    (dest / "notes.md").write_text("mine")
    before = {p.name: p.read_bytes() for p in dest.iterdir()}

    def boom(tables):
        raise RuntimeError("disk full")

    monkeypatch.setattr(tables_mod, "render_markdown", boom)
    with pytest.raises(RuntimeError):
        write_tables(out, dest)
    assert [p.name for p in tmp_path.iterdir()] == ["eval"]
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before
    monkeypatch.undo()
    names = {p.name for p in write_tables(out, dest)}
    assert {"summary.csv", "summary.md", "regions.csv", "pvalues.md",
            "regions_benchmark.md", "regions_generated.md"} <= names
    assert (dest / "notes.md").read_text() == "mine"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    with pytest.raises(OutDirError, match="holds other files"):
        write_tables(out, mine)
    assert [p.name for p in mine.iterdir()] == ["keep.txt"]


# ----------------------------------------------------------------------------- CLI


@pytest.fixture()
def setup(cat, tmp_path):
    """A private catalog copy with a hand-made ILS store and a reference CSV."""
    dst = copy_catalog(cat, tmp_path / "catalog")
    _, ils = _case_frames()
    write_ils_results(dst, ils)
    ref = tmp_path / "ref.csv"
    pd.DataFrame({"instance": list(BEST_KNOWN), "group": ["solomon", "solomon", "cordeau"],
                  "best_known": list(BEST_KNOWN.values())}).to_csv(ref, index=False)
    return dst, ref, tmp_path


def _run(setup, content: str | bytes, name: str = "res.csv", extra=()):
    from optw.cli import main

    catalog, ref, tmp = setup
    path = tmp / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp / "out"
    code = main(["evaluate", "--results", str(path), "--out", str(out), "--catalog",
                 str(catalog), "--reference", str(ref), "--quiet", *extra])
    return code, out


def _csv(rows) -> str:
    return "region,tourist,method,score,seconds\n" + "".join(f"{r}\n" for r in rows)


GOOD = [f"{r},{t},m,{s},0.5" for r, t, _, s in CASE]


def test_cli_writes_tables(setup, capsys):
    """`optw evaluate` turns a results CSV (and the same as Parquet) into the summary,
    per-region and p-value tables."""
    code, out = _run(setup, _csv(GOOD))
    assert code == 0, capsys.readouterr().err
    s = pd.read_csv(out / "summary.csv")
    row = s[(s["kind"] == "benchmark") & (s["group"] == "solomon")].iloc[0]
    assert row["gap_ils"] == pytest.approx(-2.5)
    assert (out / "regions_generated.md").read_text().count("| Solomon | c101 |") == 1
    pq_path = setup[2] / "res.parquet"
    pd.read_csv(setup[2] / "res.csv").to_parquet(pq_path)
    code, out2 = _run(setup, pq_path.read_bytes(), "res.parquet")
    assert code == 0
    assert pd.read_csv(out2 / "summary.csv").equals(s)


@pytest.mark.parametrize("content, expected", [
    ("", "is empty"),
    ("region,tourist,method,score,seconds\n", "has no rows"),
    ("region,tourist,method,score,seconds\nc101,0,m,1,0.1\nc101,1,m,1,0.1,x,y\n",
     "Expected 5 fields in line 3"),
    (b"\x00\x01 not parquet", "cannot read results file"),
    ("region,tourist,method,score\nc101,0,m,1\n", "lacks column(s) ['seconds']"),
    (_csv(GOOD[:1] + ["c1O1,0,m,1,0.5"]), "row 2 (line 3): region 'c1O1' is not in the "
     "catalog (did you mean c101?)"),
    (_csv(GOOD[:2] + ["c101,65,m,1,0.5"]), "row 3 (line 4): tourist 65 of region c101 is "
     "not in the catalog"),
    (_csv(["c101,1.5,m,1,0.5"]), "row 1 (line 2): tourist 1.5 is not an integer id"),
    (_csv(["c101,0,ils,1,0.5"]), "row 1 (line 2): method 'ils' is the name of a baseline"),
    (_csv(["c101,0,bad name,1,0.5"]), "method 'bad name' is not a valid name"),
    (_csv(["c101,0,m,-1,0.5", "c101,1,m,1,nan"]), "row 1 (line 2): score -1"),
    (_csv(GOOD + ["c101,0,m,3,0.5"]), "row 6 (line 7): duplicates row 1 (line 2)"),
    # a score past what the tourist can score (was a 300-digit gap), huge seconds
    (_csv(GOOD[:1] + ["c101,1,m,1e308,0.5"]), "row 2 (line 3): score 1e+308 is more than "
     "tourist 1 can score in c101"),
    (_csv(["c101,0,m,1811,0.5"]), "score 1811 is more than tourist 0 can score in c101 "
     "(1810, all its points)"),
    (_csv(["c101,0,m,5,1e300"]), "row 1 (line 2): seconds 1e+300 is not a finite number in "
     "[0, 1e+07]"),
])
def test_cli_bad_input(setup, capsys, content, expected):
    """Bad results tables fail with exit code 2 and a message naming the problem and row;
    nothing is written."""
    name = "res.parquet" if isinstance(content, bytes) else "res.csv"
    code, out = _run(setup, content, name)
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err, err
    assert not out.exists()


def test_cli_out_file_and_unreadable_json_lines_are_one_line(setup, capsys):
    """`evaluate --out FILE` (once a raw `[Errno 17] File exists`) is one line
    naming --out, the file untouched; a JSON-lines results file with a 5000-digit number
    names the file and line, not Python's digit limit alone."""
    from optw.cli import main

    catalog, ref, tmp = setup
    (tmp / "res.csv").write_text(_csv(GOOD))
    afile = tmp / "tables.csv"
    afile.write_text("mine")
    assert main(["evaluate", "--results", str(tmp / "res.csv"), "--out", str(afile),
                 "--catalog", str(catalog), "--reference", str(ref), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"optw evaluate: error: --out {afile}: is a file") and \
        err.count("\n") == 1
    assert afile.read_text() == "mine"
    code, out = _run(setup, '{"region": "c101", "tourist": 0, "method": "m", "score": '
                     + "9" * 5000 + ', "seconds": 1}\n', "res.jsonl")
    err = capsys.readouterr().err
    assert code == 2 and "res.jsonl line 1 cannot be read as JSON" in err, err
    assert err.count("\n") == 1 and not out.exists()


def test_cli_bad_routes_methods_and_baseline(setup, capsys):
    """An optional route column is validated (repeated node, claimed score); unknown
    --methods and --baseline names are refused; missing ILS pairs name the fix."""
    rows = "region,tourist,method,score,seconds,route\n" + "".join(
        f"{r},{t},m,{s},0.5,\n" for r, t, _, s in CASE[1:])
    code, out = _run(setup, rows + "c101,0,m,20,0.5,0 1 1 101\n")
    err = capsys.readouterr().err
    assert code == 2 and "row 5 (line 6): invalid route" in err and "more than once" in err
    assert not out.exists()
    code, _ = _run(setup, rows + "c101,0,m,20,0.5,\"[0, 1, 101]\"\n")
    assert code == 2 and "claimed score 20" in capsys.readouterr().err
    code, out = _run(setup, rows + "c101,0,m,10,0.5,\"[0, 1, 101]\"\n")
    assert code == 0
    code, _ = _run(setup, _csv(GOOD), extra=["--methods", "model_as"])
    assert code == 2 and "method(s) ['model_as'] not in" in capsys.readouterr().err
    code, _ = _run(setup, _csv(GOOD), extra=["--baseline", "greedy"])
    assert code == 2 and "unknown baseline 'greedy'" in capsys.readouterr().err
    code, _ = _run(setup, _csv(GOOD + ["t101,0,m,5,0.5"]))
    assert code == 2 and "optw baseline ils --regions t101" in capsys.readouterr().err


def test_default_reference_path(monkeypatch, tmp_path):
    """OPTW_REFERENCE overrides the folder of the best-known scores."""
    monkeypatch.setenv("OPTW_REFERENCE", str(tmp_path))
    assert tables_mod.default_reference_path() == Path(tmp_path) / "paper_benchmark_scores.csv"
    monkeypatch.delenv("OPTW_REFERENCE")
    assert tables_mod.default_reference_path().parts[-3:] == (
        "shared", "reference", "paper_benchmark_scores.csv")


@pytest.mark.parametrize("one_by_one", [False, True])
def test_evaluation_stores_per_tourist_solve_times(tiny_catalog, tmp_path, one_by_one):
    """The benchmark tourist is timed on its own (not as a share of the validation batch), and
    with ``one_by_one`` each validation tourist has its own time; scores do not depend on it."""
    from optw.evaluate.protocol import EvaluateSettings, evaluate_model
    from optw.model import ModelConfig, PointerNet, save_model

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    ckpt = save_model(PointerNet(ModelConfig()), tmp_path / "m.pt")
    settings = EvaluateSettings(beams=2, validation_tourists=6, beam_sweep=[],
                                one_by_one=one_by_one)
    rows, _ = evaluate_model(str(ckpt), ["pr99"], "model", settings, str(tiny_catalog.path))
    for method in ("model", "model_greedy"):
        mine = [r for r in rows if r["method"] == method]
        bench = [r["seconds"] for r in mine if r["kind"] == "benchmark"]
        val = [r["seconds"] for r in mine if r["kind"] == "validation"]
        assert len(bench) == 1 and len(val) == 6 and all(s > 0 for s in bench + val)
        assert bench[0] not in val
        assert (len(set(val)) > 1) == one_by_one
    if one_by_one:
        batch, _ = evaluate_model(str(ckpt), ["pr99"], "model",
                                  EvaluateSettings(beams=2, validation_tourists=6,
                                                   beam_sweep=[]), str(tiny_catalog.path))
        assert [r["score"] for r in batch] == [r["score"] for r in rows]


def test_evaluation_rows_are_the_methods_own_solutions(tiny_catalog, tmp_path):
    """The evaluation decodes greedy once and lets beam search and the sweep keep its routes:
    every row and sweep entry has the route and score ``solve`` gives for that method alone
    (keep_greedy decoding greedy itself), and the sweep's entry at the evaluation's own width
    is the benchmark tourist's beam row."""
    from optw.catalog import open_catalog
    from optw.decode import solve
    from optw.evaluate.protocol import EvaluateSettings, evaluate_model
    from optw.model import ModelConfig, PointerNet, load_model, save_model

    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    ckpt = save_model(PointerNet(ModelConfig()), tmp_path / "m.pt")
    settings = EvaluateSettings(beams=4, validation_tourists=5, beam_sweep=[1, 4])
    rows, sweep = evaluate_model(str(ckpt), ["pr99"], "model", settings,
                                 str(tiny_catalog.path))
    cat, model = open_catalog(tiny_catalog.path), load_model(ckpt)
    region = cat.region("pr99")
    bench, val = cat.benchmark("pr99"), cat.validation("pr99")[:5]
    for name, method, kw in (("model_greedy", "greedy", {}), ("model", "beam", {"beams": 4})):
        want = [s for t in (bench, val) for s in solve(model, region, t, method, **kw)]
        got = [r for r in rows if r["method"] == name]
        assert [json.loads(r["route"]) for r in got] == [s.route for s in want]
        assert [r["score"] for r in got] == [s.score for s in want]
    assert [s["beams"] for s in sweep] == [1, 4]
    one = solve(model, region, bench, "beam", beams=1)[0]
    assert sweep[0]["score"] == one.score
    bench_row = next(r for r in rows if r["method"] == "model" and r["kind"] == "benchmark")
    assert (sweep[1]["score"], sweep[1]["seconds"]) == (bench_row["score"], bench_row["seconds"])


def test_gap_to_ils_of_a_model_validated_on_several_regions():
    """A global model's validation gap to ILS (what Ray Tune ranks trials on and the job's
    gauges show) is the mean over its regions of each region's gap, each region's score taken
    from its ``val_score/<region>``; a one-region model's plain ``val_score`` serves its one
    region; regions without an ILS mean (or a zero one) are left out; None without any."""
    from optw.evaluate.protocol import gap_to_ils

    metrics = {"val_score/pr01": 90.0, "val_score/pr02": 150.0, "val_score": 120.0}
    ils = {"pr01": 100.0, "pr02": 200.0}
    assert gap_to_ils(metrics, ils) == pytest.approx((10.0 + 25.0) / 2)
    assert gap_to_ils({"val_score": 110.0}, {"r199": 100.0}) == pytest.approx(-10.0)
    assert gap_to_ils(metrics, {"pr01": 100.0, "c101": 0.0}) == pytest.approx(10.0)
    assert gap_to_ils(metrics, {}) is None


def test_active_search_in_an_evaluation_shows_a_progress_bar(tiny_catalog, tmp_path, capfd):
    """An evaluation with active search shows one tqdm bar over every epoch of every tourist
    it tunes (on stderr; asked for here, by default only on a terminal), naming the region and
    the tourist; without a terminal it stays quiet."""
    from optw.evaluate.protocol import EvaluateSettings, evaluate_model
    from optw.model import ModelConfig, PointerNet, save_model

    torch = pytest.importorskip("torch")
    torch.manual_seed(2)
    ckpt = save_model(PointerNet(ModelConfig()), tmp_path / "m.pt")
    settings = EvaluateSettings(beams=2, validation_tourists=2, beam_sweep=[],
                                active_search=2)
    rows, _ = evaluate_model(str(ckpt), ["pr99"], "model", settings, str(tiny_catalog.path),
                             progress=True)
    err = capfd.readouterr().err
    assert "active search" in err and "6/6" in err and "region=pr99" in err, err
    assert len([r for r in rows if r["method"] == "model_as"]) == 3
    evaluate_model(str(ckpt), ["pr99"], "model", settings, str(tiny_catalog.path))
    assert "active search" not in capfd.readouterr().err  # stderr is no terminal here


def test_user_errors_of_these_layers_are_optw_errors(cat, tmp_path):
    """Every error these layers raise for bad input is an OptwError (the command line's one
    line, exit 2) and keeps its builtin base (callers catching ValueError etc. still work);
    an unknown region is a KeyError that reads as its message."""
    from optw.baselines.store import run_ils_baseline
    from optw.catalog import CatalogError, CustomRegionError, SourceError, TouristError
    from optw.catalog.store import UnknownRegionError
    from optw.errors import OptwError
    from optw.evaluate.paper import parse_column_map
    from optw.outdir import OutDirError
    from optw.report.data import RunNotFoundError
    from optw.tracking import TrackingUnavailableError

    for cls, base in ((CatalogError, RuntimeError), (CustomRegionError, ValueError),
                      (SourceError, ValueError), (TouristError, ValueError),
                      (ResultsError, ValueError), (OutDirError, ValueError),
                      (TrackingUnavailableError, RuntimeError), (UnknownRegionError, KeyError),
                      (RunNotFoundError, KeyError)):
        assert issubclass(cls, OptwError) and issubclass(cls, base), cls
    with pytest.raises(UnknownRegionError) as err:
        cat.region("c1O1")
    assert str(err.value).startswith("unknown region 'c1O1'; did you mean c101")
    for call in (lambda: cat.list_regions("nope"), lambda: cat.tourists("c101", "nope"),
                 lambda: parse_column_map(["beam=nope"]),
                 lambda: tables_mod.read_reference(tmp_path / "none.csv", ("ils",)),
                 lambda: run_ils_baseline(cat.path, regions=["c101"], tourists="nope")):
        with pytest.raises(OptwError):
            call()
