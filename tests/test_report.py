"""Job reports (``optw report``): content from a real MLflow store, atomic writes, the
artifact logged to the parent run, and the page in a real headless Chromium.

The stores are written through the real tracking API in the jobs' structure (parent run with
tables, child runs with metric histories and evaluation rows): a scratch job and a global-ft
job (global models, then fine-tuning runs that validate before their first epoch and at
their end); fast, no training. ``test_report_job.py`` reports a real tiny job (slow).
"""

from __future__ import annotations

import base64
import json
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from chromium import (
    CHROMIUM_INSTALL,
    DevTools,
    find_chromium,
    page_errors,
    page_target,
    start_chromium,
)
from conftest import stop_process

REGIONS = {"r199": "solomon", "c199": "solomon", "pr99": "cordeau", "t199": "gavalas"}
BEST_KNOWN = {"r199": 60.0, "c199": 70.0, "pr99": 90.0, "t199": 80.0}
METHODS = ("model_greedy", "model", "model_as")


# ----------------------------------------------------------------------------- a job's store


def make_job_store(uri: str, job: str = "optw-report-test") -> str:
    """A parent run + one child per region in the platform job's structure, written through
    the real tracking API (tables computed by ``optw.evaluate``); returns the parent run id."""
    from mlflow.entities import Metric

    from optw.evaluate import evaluate
    from optw.tracking import (
        end_run,
        get_client,
        log_evaluation,
        log_tables,
        set_tags,
        start_job_run,
    )

    rng = np.random.default_rng(0)
    client = get_client(uri)
    parent = start_job_run(job, {"train": {"epochs": 6}}, tags={
        "mode": "scratch", "profile": "test", "catalog_version": "1", "regions": len(REGIONS)},
        uri=uri)
    rows, ils, sweep = [], [], []
    for rid, group in REGIONS.items():
        run_id = parent.child("scratch", rid, {"train": {"epochs": 6}},
                              tags={"mode": "scratch", "profile": "test"})
        ts = int(time.time() * 1000)
        metrics = []
        for epoch in range(1, 7):
            metrics.append(Metric("mean_reward", 10 + 5 * epoch + rng.normal(), ts, epoch))
            if epoch % 2 == 0:
                metrics += [Metric("val_score", 20 + 6 * epoch + rng.normal(), ts, epoch),
                            Metric("benchmark_score", 30 + 4 * epoch, ts, epoch)]
        client.log_batch(run_id, metrics=metrics)
        base = BEST_KNOWN[rid]
        eval_rows = []
        for tourist in range(5):
            kind = "benchmark" if tourist == 0 else "validation"
            ils_score = base * (0.95 if tourist == 0 else rng.uniform(0.5, 0.9))
            ils.append({"region": rid, "tourist": tourist, "kind": kind, "score": ils_score,
                        "seconds": 0.5})
            for i, method in enumerate(METHODS):
                score = ils_score * (0.80 + 0.07 * i + rng.uniform(-0.02, 0.02))
                eval_rows.append({"region": rid, "tourist": tourist, "kind": kind,
                                  "method": method, "score": score,
                                  "seconds": 0.01 * (1 + 20 * i), "route": "[1, 2]"})
        for beams in (1, 2, 4, 8):
            sweep.append({"region": rid, "method": "model", "beams": beams,
                          "score": base * (0.75 + 0.03 * np.log2(beams)),
                          "seconds": 0.01 * beams})
        log_evaluation(run_id, pd.DataFrame(eval_rows), f"evaluation_{rid}", uri=uri)
        log_tables(run_id, {"beam_sweep": pd.DataFrame([s for s in sweep
                                                        if s["region"] == rid])}, uri=uri)
        set_tags(run_id, {"val_score": eval_rows[-1]["score"], "version": "1"}, uri)
        end_run(run_id, "FINISHED", uri)
        rows += [{**r, "group": group} for r in eval_rows]
    results = pd.DataFrame(rows).drop(columns=["route"])
    tables = evaluate(results, pd.DataFrame(ils), pd.Series(BEST_KNOWN), n_resamples=200)
    tables["beam_sweep"] = pd.DataFrame(sweep)
    log_tables(parent.run_id, tables, uri=uri)
    parent.finish("FINISHED")
    return parent.run_id


FT_REGIONS = {"r199": "solomon", "c199": "solomon", "pr99": "cordeau"}
#: fine-tuned region -> (gap to ILS before fine-tuning, after it) on its validation tourists
FT_GAPS = {"r199": (12.0, 7.5), "c199": (9.0, 9.5), "pr99": (20.0, 11.0)}
#: the released global models of :func:`make_finetune_store` with ``releases=True``
RELEASES = {"solomon": "solomon v1 (sha256 1a2b3c4d5e6f)",
            "cordeau": "cordeau v2 (sha256 0f9e8d7c6b5a)"}


def make_finetune_store(uri: str, job: str = "optw-finetune-test", *, releases: bool = False,
                        demos: int = 0, start_evaluated: bool = False,
                        gaps: dict[str, tuple[float, float]] = FT_GAPS) -> str:
    """A global-ft job's store: per group a global model (training reward every 10 epochs,
    validation every 20), then one fine-tuning run per region started from it, validated at
    epoch 0 (the global model) and at its end (epoch 2), with evaluation rows (beam 2 below
    the greedy gap), a beam sweep and the job's tables; plus a global model of one logged
    point (never drawn). ``releases``: the fine-tunes start from :data:`RELEASES` instead (no
    global runs; tags as the job writes them); ``demos``: the fine-tunes learned from that
    many demonstrations per region (2 imitation epochs); ``start_evaluated``: the global
    models were evaluated on the regions too (beam, as transfer modes do). Returns the parent
    run id."""
    from mlflow.entities import Metric

    from optw.evaluate import evaluate
    from optw.tracking import end_run, get_client, log_evaluation, log_tables, start_job_run

    client = get_client(uri)
    parent = start_job_run(job, {"job": {"mode": "global-ft"}}, tags={
        "mode": "global-ft", "profile": "test", "catalog_version": "1",
        "regions": len(FT_REGIONS),
        **({"releases": "; ".join(RELEASES.values())} if releases else {})}, uri=uri)
    rows, ils, sweep = [], [], []

    def ils_rows(rid: str) -> None:
        ils.extend({"region": rid, "tourist": tourist, "score": 100.0, "seconds": 0.5,
                    "kind": "benchmark" if tourist == 0 else "validation"}
                   for tourist in range(5))

    def log_rows(run_id: str, rid: str, scores: dict[str, float]) -> None:
        eval_rows = [{"region": rid, "tourist": tourist, "method": method, "score": score,
                      "kind": "benchmark" if tourist == 0 else "validation",
                      "seconds": 0.02 if method.endswith("_greedy") else 0.3, "route": "[1]"}
                     for tourist in range(5) for method, score in scores.items()]
        log_evaluation(run_id, pd.DataFrame(eval_rows), f"evaluation_{rid}", uri=uri)
        rows.extend({**r, "group": FT_REGIONS[rid]} for r in eval_rows)

    for rid in FT_REGIONS:
        ils_rows(rid)
    for g, shift in (() if releases else (("solomon", 0.0), ("cordeau", 15.0))):
        run_id = parent.child("global", f"global-{g}", {"train": {"epochs": 100}})
        metrics = []
        for epoch in [1, *range(10, 101, 10)]:
            metrics.append(Metric("mean_reward", 20 + 30 * (1 - 0.97 ** epoch) + shift, 0,
                                  epoch))
            if epoch % 20 == 0:
                metrics += [Metric("val_score", 25 + 32 * (1 - 0.97 ** epoch) + shift, 0,
                                   epoch),
                            Metric("benchmark_score", 30 + 25 * (1 - 0.96 ** epoch), 0, epoch),
                            Metric("val_gap_ils", 40 * 0.97 ** epoch + 5 + shift / 3, 0,
                                   epoch)]
        client.log_batch(run_id, metrics=metrics)
        for rid in (r for r, rg in FT_REGIONS.items() if rg == g and start_evaluated):
            log_rows(run_id, rid, {"global": 100 - gaps[rid][0] + 2})
        end_run(run_id, "FINISHED", uri)
    if not releases:
        lone = parent.child("global", "global-gavalas", {"train": {"epochs": 1}})
        client.log_batch(lone, metrics=[Metric("val_score", 5.0, 0, 1)])
        end_run(lone, "FINISHED", uri)
    for rid, group in FT_REGIONS.items():
        train = {"epochs": 2, "val_tourists": 4, "demos": demos,
                 "imitation_epochs": 2 if demos else 0}
        run_id = parent.child("finetune", rid, {
            "train": train, "init_from": f"release:{group}" if releases else f"global-{group}"},
            tags={"release": RELEASES[group]} if releases else None)
        before, after = gaps[rid]
        client.log_batch(run_id, metrics=[
            Metric("val_score", 100 - before, 0, 0), Metric("val_gap_ils", before, 0, 0),
            Metric("mean_reward", 80.0, 0, 1), Metric("mean_reward", 82.0, 0, 2),
            Metric("val_score", 100 - after, 0, 2), Metric("val_gap_ils", after, 0, 2)])
        log_rows(run_id, rid, {"global_ft_greedy": 100 - after, "global_ft": 100 - after + 2})
        sweep += [{"region": rid, "method": "global_ft", "beams": beams,
                   "score": 95.0 + beams, "seconds": 0.01 * beams} for beams in (1, 2)]
        end_run(run_id, "FINISHED", uri)
    results = pd.DataFrame(rows).drop(columns=["route"])
    tables = evaluate(results, pd.DataFrame(ils), None, n_resamples=200)
    tables["beam_sweep"] = pd.DataFrame(sweep)
    log_tables(parent.run_id, tables, uri=uri)
    parent.finish("FINISHED")
    return parent.run_id


@pytest.fixture(scope="module")
def finetune_store(tmp_path_factory) -> tuple[str, str]:
    """(tracking URI, parent run id) of a small global-ft job store."""
    root = tmp_path_factory.mktemp("report-finetune")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    return uri, make_finetune_store(uri)


@pytest.fixture(scope="module")
def job_store(tmp_path_factory) -> tuple[str, str]:
    """(tracking URI, parent run id) of a small job store in a temp folder."""
    root = tmp_path_factory.mktemp("report-store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    return uri, make_job_store(uri)


# ----------------------------------------------------------------------------- content


def test_report_content(job_store, tmp_path):
    """The page has every section (curves per group, gaps, time/score, group tables with CIs,
    run ids and the `mlflow ui` command for a sqlite store), every linked image exists as a
    non-empty PNG, and nothing refers to the network."""
    import re

    from optw.report import write_report

    uri, parent = job_store
    index = write_report(parent, tmp_path / "report", uri)
    html = index.read_text()
    for anchor in ("curves", "gaps", "time", "tables", "runs"):
        assert f'id="{anchor}"' in html
    srcs = re.findall(r'<img src="([^"]+)"', html)
    expected = {"plots/curves_solomon.png", "plots/curves_cordeau.png",
                "plots/curves_gavalas.png", "plots/gaps_validation.png",
                "plots/gaps_benchmark.png", "plots/time_score.png"}
    assert set(srcs) == expected
    for src in srcs:
        data = (index.parent / src).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    assert "gap to ILS % [95% CI]" in html and "gap to best-known % [95% CI]" in html
    assert re.search(r"-?\d+\.\d\d \[-?\d+\.\d\d, -?\d+\.\d\d\]", html)  # value [lo, hi]
    assert "mlflow ui --backend-store-uri" in html and parent in html
    assert "active search" in html  # model_as rows become the time/score figure's stars
    assert not re.search(r"(src|href)=\"(https?:)?//", html)  # no external resources
    assert "<script" not in html


def test_time_score_points_and_http_links(job_store):
    """Time/score points: one per (group, method, beam width) from the beam sweep plus active
    search from the evaluation rows, gap to ILS from the regions table; an http store gets
    links `<uri>/#/experiments/<exp>/runs/<run>`."""
    from optw.report import load_job
    from optw.report.plots import time_score_points

    uri, parent = job_store
    data = load_job(parent, uri)
    pts = time_score_points(data)
    sol = pts[pts["group"] == "solomon"]
    assert list(sol["setting"]) == ["beams=1", "beams=2", "beams=4", "beams=8",
                                    "active search"]
    assert (sol["regions"] == 2).all() and pts["gap_ils"].notna().all()
    assert {c.group for c in data.children} == {"solomon", "cordeau", "gavalas"}
    curve = data.children[0].curves["val_score"]
    assert list(curve["step"]) == [2, 4, 6]
    data.uri = "http://mlflow.example:5000/"
    assert data.run_url("abc") == (f"http://mlflow.example:5000/#/experiments/"
                                   f"{data.experiment_id}/runs/abc")


def test_report_replaces_atomically_and_keeps_old_on_failure(job_store, tmp_path,
                                                             monkeypatch):
    """A second report replaces its own earlier output as a whole (a stale plot goes); a
    failing one leaves the previous report untouched and no temporary folders behind."""
    from optw.report import build, write_report

    uri, parent = job_store
    out = tmp_path / "report"
    write_report(parent, out, uri)
    (out / "plots" / "stale.png").write_text("old")
    write_report(parent, out, uri)
    assert not (out / "plots" / "stale.png").exists()
    before = (out / "index.html").read_text()

    def boom(*args, **kwargs):
        raise RuntimeError("render failed")

    monkeypatch.setattr(build, "render", boom)
    with pytest.raises(RuntimeError, match="render failed"):
        write_report(parent, out, uri)
    assert (out / "index.html").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_report_never_replaces_a_folder_or_file_it_does_not_own(job_store, tmp_path, capsys):
    """No data loss: `optw report --out DIR` where DIR holds other files, or --out an
    existing file, is refused in one line naming --out, and nothing is moved or deleted; a
    previous report (it carries a marker file) and an empty folder are replaced."""
    from optw.cli import main
    from optw.outdir import OutDirError, marker
    from optw.report import build, write_report

    uri, parent = job_store
    args = ["report", "--run", parent, "--tracking-uri", uri, "--out"]
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "data.txt").write_text("keep me")
    afile = tmp_path / "existing.csv"
    afile.write_text("a,b\n1,2\n")
    for out in (folder, afile):
        capsys.readouterr()
        assert main([*args, str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"optw report: error: --out {out}:") and err.count("\n") == 1
    assert (folder / "data.txt").read_text() == "keep me" and [*folder.iterdir()] == [
        folder / "data.txt"]
    assert afile.read_text() == "a,b\n1,2\n"
    with pytest.raises(OutDirError):
        write_report(parent, folder, uri)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing.csv", "mine"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([*args, str(empty)]) == 0
    assert (empty / marker(build.OUT_KIND)).is_file() and (empty / "index.html").is_file()
    (empty / "plots" / "stale.png").write_text("x")
    assert main([*args, str(empty)]) == 0  # a previous report: its output replaced whole
    assert not (empty / "plots" / "stale.png").exists()
    assert (empty / marker(build.OUT_KIND)).is_file()


def test_global_models_curves_and_the_finetune_chart(finetune_store, tmp_path):
    """A global-ft job's report opens with one figure of the global models' learning curves
    (reward, validation and gap to ILS over epochs; a model of one logged point is left out)
    and one chart of every fine-tuned region's gap to ILS before (the global model, the
    fine-tuning run's validation at epoch 0) and after (its last validation), with the
    evaluation's gap beside it; no figure per fine-tuning run."""
    import re

    from optw.report import load_job, write_report
    from optw.report.plots import finetune_points, has_curve

    uri, parent = finetune_store
    index = write_report(parent, tmp_path / "report", uri)
    html = index.read_text()
    srcs = re.findall(r'<img src="([^"]+)"', html)
    assert srcs[:2] == ["plots/curves_global.png", "plots/finetune.png"], srcs
    assert not any(s.startswith("plots/curves_") and s != "plots/curves_global.png"
                   for s in srcs)
    assert 'id="finetune"' in html and "before its first epoch" in html
    assert html.index('id="curves"') < html.index('id="finetune"') < html.index('id="gaps"')
    data = load_job(parent, uri)
    drawn = {c.key for c in data.children if c.stage == "global" and has_curve(c)}
    assert drawn == {"global-solomon", "global-cordeau"}
    pts = finetune_points(data.children, data.tables["regions"]).set_index("region")
    assert set(pts.index) == set(FT_REGIONS) and set(pts["metric"]) == {"val_gap_ils"}
    for rid, (before, after) in FT_GAPS.items():
        assert (pts.at[rid, "before"], pts.at[rid, "after"]) == (before, after)
        assert pts.at[rid, "start"] == f"global-{FT_REGIONS[rid]}"
    assert pts.at["r199", "evaluated"] == pytest.approx(FT_GAPS["r199"][1] - 2.0)
    assert (pts["after_epoch"] == 2).all() and (pts["val_tourists"] == "4").all()


def test_report_of_a_job_that_failed_before_evaluation(tmp_path):
    """A job with training curves but no tables or evaluation rows (failed half-way) still
    gets a report: the curves, and 'no data' notes instead of missing images."""
    from mlflow.entities import Metric

    from optw.report import write_report
    from optw.tracking import end_run, get_client, start_job_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = start_job_run("optw-broken", {"train": {"epochs": 4}}, uri=uri)
    child = parent.child("global", "global-gavalas")
    get_client(uri).log_batch(child, metrics=[Metric("val_score", 10.0 * e, 0, e)
                                              for e in (2, 4)])
    end_run(child, "FAILED", uri)
    parent.finish("FAILED")
    html = write_report(parent.run_id, tmp_path / "report", uri).read_text()
    assert html.count("<img ") == 1 and "plots/curves_global.png" in html
    assert "no data" in html and "No summary table" in html
    assert 'class="status-FAILED"' in html


def test_write_and_log_report_and_cli(job_store, tmp_path, capsys):
    """`write_and_log_report` logs the folder as artifact `report/` of the parent run;
    `optw report --job` finds the newest parent run of the job and writes the folder."""
    from optw.cli import main
    from optw.report import write_and_log_report
    from optw.tracking import get_client

    uri, parent = job_store
    write_and_log_report(parent, tmp_path / "logged", uri)
    client = get_client(uri)
    names = {f.path for f in client.list_artifacts(parent, "report")}
    assert {"report/index.html", "report/plots"} <= names
    assert len(client.list_artifacts(parent, "report/plots")) == 6
    assert main(["report", "--job", "optw-report-test", "--tracking-uri", uri,
                 "--out", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / "index.html").is_file()
    assert "wrote" in capsys.readouterr().out
    assert main(["report", "--job", "no-such-job", "--tracking-uri", uri]) == 2
    assert main(["report", "--run", "0" * 32, "--tracking-uri", uri]) == 2


# ----------------------------------------------------------------------------- what the page says


def _drawn(fig):
    """``fig`` drawn by Agg (its artists placed); returns the renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def test_finetune_chart_compares_like_with_like(finetune_store, tmp_path):
    """The fine-tuning chart compares the same decoder and tourists before and after: greedy
    on the run's validation tourists, and the beam evaluation only where the job evaluated
    the start model too (never a lone 'after' beam mark to be read against a greedy
    'before'); each panel's headline names the decoder and the number of tourists."""
    from optw.report import load_job
    from optw.report.plots import finetune_figure, finetune_points

    uri, parent = finetune_store
    data = load_job(parent, uri)
    pts = finetune_points(data.children, data.tables["regions"])
    assert pts["evaluated_before"].isna().all() and pts["evaluated"].notna().all()
    fig = finetune_figure(pts, data.groups())
    labels = fig.legends[0].get_texts()
    assert [t.get_text() for t in labels] == [
        "greedy, 4 tourists: before (the model it starts from)",
        "greedy, 4 tourists: after (the fine-tuned model)"]
    assert all("greedy, 4 tourists: mean" in ax.get_title() and "beam" not in ax.get_title()
               for ax in fig.axes)

    uri2 = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent2 = make_finetune_store(uri2, "optw-transfer-test", start_evaluated=True)
    data2 = load_job(parent2, uri2)
    pts2 = finetune_points(data2.children, data2.tables["regions"]).set_index("region")
    for rid, (before, after) in FT_GAPS.items():  # the beam gaps: 2 below the greedy ones
        assert pts2.loc[rid, ["evaluated_before", "evaluated"]].tolist() == pytest.approx(
            [before - 2, after - 2])
    assert (pts2["eval_tourists"] == 4).all()
    fig2 = finetune_figure(pts2.reset_index(), data2.groups())
    texts = [t.get_text() for t in fig2.legends[0].get_texts()]
    assert "beam, 4 tourists: before (the model it starts from)" in texts
    assert "beam, 4 tourists: after (the fine-tuned model)" in texts
    assert all("beam, 4 tourists: mean" in ax.get_title() for ax in fig2.axes)


def test_finetune_chart_shows_before_and_after_when_equal(tmp_path):
    """A region whose gap did not change still shows both marks: 'before' is a large
    unfilled ring, 'after' a smaller filled dot drawn over it at the same place (a dot in a
    ring), for the greedy and the beam comparison alike."""
    from optw.report import load_job
    from optw.report.plots import AFTER_SIZE, BEFORE_SIZE, finetune_figure, finetune_points

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    gaps = {"r199": (12.0, 12.0), "c199": (9.0, 9.5), "pr99": (20.0, 20.0)}
    parent = make_finetune_store(uri, "optw-equal-test", start_evaluated=True, gaps=gaps)
    data = load_job(parent, uri)
    fig = finetune_figure(finetune_points(data.children, data.tables["regions"]),
                          data.groups())
    assert BEFORE_SIZE >= 3 * AFTER_SIZE
    for ax in fig.axes:
        marks = {c.get_label(): c for c in ax.collections}
        for what in ("greedy", "beam"):
            before = marks[f"{what}, 4 tourists: before (the model it starts from)"]
            after = marks[f"{what}, 4 tourists: after (the fine-tuned model)"]
            assert (before.get_sizes() == BEFORE_SIZE).all()
            assert (after.get_sizes() == AFTER_SIZE).all()
            assert (before.get_facecolors()[:, 3] == 0).all()  # a ring: unfilled
            assert after.get_zorder() > before.get_zorder()  # the dot on top of its ring
    solomon = {c.get_label(): c.get_offsets() for c in fig.axes[0].collections}
    ring = solomon["greedy, 4 tourists: before (the model it starts from)"]
    dot = solomon["greedy, 4 tourists: after (the fine-tuned model)"]
    r199 = 1  # regions sorted: c199, r199
    assert tuple(ring[r199]) == tuple(dot[r199]) == (12.0, pytest.approx(1 - 0.17))


def test_tall_gap_charts_have_legend_and_axis_label_on_top(job_store):
    """A gaps-per-region chart of many regions (a row each: thousands of pixels) carries its
    legend (titled with the chart's title) above the panels, and each panel's axis label and
    ticks on top as well as at the bottom."""
    from optw.report import load_job
    from optw.report.plots import method_colors, region_gaps_figure

    uri, parent = job_store
    data = load_job(parent, uri)
    regions = data.tables["regions"]
    many = pd.concat([regions.assign(region=regions["region"] + f"_{i}") for i in range(15)],
                     ignore_index=True)
    fig = region_gaps_figure(many, "benchmark", data.groups(), method_colors(many["method"]))
    assert fig.get_figheight() > 15  # 60 regions
    renderer = _drawn(fig)
    legend = fig.legends[0]
    assert legend.get_title().get_text().startswith("Gap per region, benchmark tourists")
    assert fig.get_suptitle() == ""  # the title is the legend's: nothing overlaps it
    box = legend.get_window_extent(renderer)
    for ax in fig.axes[:2]:
        panel = ax.get_window_extent(renderer)
        assert box.y0 >= panel.y1, (box, panel)
        (top,) = ax.child_axes
        label = top.xaxis.label
        assert label.get_text() == ax.get_xlabel() and label.get_text().startswith("gap to")
        assert panel.y1 < label.get_window_extent(renderer).y0 < box.y0


def _x_label_boxes(ax, renderer) -> list:
    """The window boxes of the drawn major x tick labels of ``ax`` (inside its view)."""
    lo, hi = sorted(ax.get_xlim())
    return sorted((t.get_window_extent(renderer) for loc, t in
                   zip(ax.get_xticks(), ax.get_xticklabels(), strict=True)
                   if lo <= loc <= hi and t.get_text()), key=lambda b: b.x0)


def test_time_score_tick_labels_do_not_overlap(job_store):
    """The time-vs-score panels' log time axes carry plain, non-overlapping tick labels (at
    least two per panel, none on the minor ticks), for the job's points and for times
    spread over less than a decade or over several decades."""
    from optw.report import load_job
    from optw.report.plots import ils_points, method_colors, time_score_figure, time_score_points

    uri, parent = job_store
    data = load_job(parent, uri)
    pts = ils_points(data, time_score_points(data))
    colors = method_colors(pts["method"])
    for seconds in (pts["seconds"], np.linspace(0.41, 0.93, len(pts)),
                    np.geomspace(0.004, 0.9, len(pts)), np.geomspace(0.0008, 40, len(pts))):
        fig = time_score_figure(pts.assign(seconds=seconds), data.groups(), colors)
        renderer = _drawn(fig)
        for ax in fig.axes:
            boxes = _x_label_boxes(ax, renderer)
            assert len(boxes) >= 2, ax.get_xlim()
            assert all(a.x1 < b.x0 for a, b in pairwise(boxes)), (
                ax.get_xlim(), [t.get_text() for t in ax.get_xticklabels()])
            assert not any(t.get_text() for t in ax.get_xticklabels(minor=True))


def test_time_section_ils_row_and_no_promise_of_absent_points(job_store, finetune_store,
                                                              tmp_path):
    """The time-vs-score points table has an ILS row per group (its mean score and seconds on
    the benchmark tourists, gap 0), drawn as × in the figure; the section's note names
    active search only when the job made active-search points."""
    import re

    from optw.report import load_job, write_report
    from optw.report.plots import ils_points, time_score_points

    for (uri, parent), active in ((job_store, True), (finetune_store, False)):
        data = load_job(parent, uri)
        pts = ils_points(data, time_score_points(data))
        assert ("active search" in set(pts["setting"])) is active
        ils = pts[pts["method"] == "ILS"].set_index("group")
        assert set(ils.index) == set(pts["group"]) and (ils["gap_ils"] == 0).all()
        bench = data.tables["regions"].query("kind == 'benchmark'").drop_duplicates("region")
        means = bench.groupby("group")[["ils", "ils_seconds"]].mean()
        for g in ils.index:
            assert ils.at[g, "score"] == pytest.approx(means.at[g, "ils"])
            assert ils.at[g, "seconds"] == pytest.approx(means.at[g, "ils_seconds"])
        html = write_report(parent, tmp_path / f"report-{active}", uri).read_text()
        section = re.search(r'<section id="time">.*?</section>', html, re.S).group(0)
        assert ("active search" in section) is active, section[:400]
        assert "ILS (×)" in section and '<td class="l">ILS</td>' in section


def test_tables_scroll_inside_their_box_and_runs_are_folded(job_store, tmp_path):
    """Every table sits in a box that scrolls sideways (``overflow-x:auto``) rather than
    overflowing the page, and the MLflow runs table is folded in a <details> that says how
    many runs it holds."""
    import re

    from optw.report import write_report
    from optw.report.html import CSS

    uri, parent = job_store
    html = write_report(parent, tmp_path / "report", uri).read_text()
    assert re.search(r"\.scroll\{[^}]*overflow-x:auto", CSS)
    assert html.count("<table>") >= 4
    assert html.count("<table>") == html.count('<div class="scroll"><table>')
    runs = re.search(r'<section id="runs">.*?</section>', html, re.S).group(0)
    assert re.search(r"<details><summary>4 child runs</summary><div class=\"scroll\"><table>",
                     runs), runs[-600:]
    assert runs.count("<table>") == 1 and runs.index("<details>") < runs.index("<table>")


def test_releases_and_demonstrations_are_named(finetune_store, tmp_path):
    """A job started from released global models names each (its tag ``releases``) in the
    header and in the learning-curves note, and each fine-tune's 'started from' names its
    release; a job whose runs learned from demonstrations says so (how many per region,
    imitation epochs). A job that used neither mentions neither."""
    import re

    from optw.report import load_job, write_report

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = make_finetune_store(uri, "optw-release-test", releases=True, demos=8)
    data = load_job(parent, uri)
    assert data.releases() == list(RELEASES.values())
    assert [(d.stage, d.runs, d.demos, d.imitation_epochs) for d in data.demonstrations()] == [
        ("finetune", 3, 8, 2)]
    html = write_report(parent, tmp_path / "report", uri).read_text()
    header = re.search(r"<header>.*?</header>", html, re.S).group(0)
    assert ("Started from released global models: solomon v1 (sha256 1a2b3c4d5e6f); "
            "cordeau v2 (sha256 0f9e8d7c6b5a)") in header
    assert ("Learned from demonstrations (ILS routes): 3 fine-tuning runs: 8 per region, "
            "2 imitation epochs before REINFORCE") in header
    curves = re.search(r'<section id="curves">.*?</section>', html, re.S).group(0)
    assert "releases, trained before this job" in curves
    for group, label in RELEASES.items():
        assert html.count(f"<td class=\"l\">release {label}</td>") == 2 * sum(
            g == group for g in FT_REGIONS.values())  # fine-tuning table and runs table
    plain = write_report(finetune_store[1], tmp_path / "plain", finetune_store[0]).read_text()
    assert "release" not in plain.lower() and "demonstration" not in plain.lower()


# ----------------------------------------------------------------------------- the browser


def screenshot_report(index: Path, tmp_path: Path, png: Path, width: int = 1400,
                      ) -> dict[str, Any]:
    """Open a report in a real headless Chromium, check that nothing failed to load, nothing
    but files was requested and no console error was logged, and save a full-page screenshot
    as ``png``. Returns the page's title, height, width (``scrollWidth``: wider than the
    viewport means something overflows), images ``[src, width, height]``, number of tables
    and the table boxes ``[section id, scrollWidth, clientWidth]`` (0: folded). Skips without
    Chromium."""
    from websockets.sync.client import connect

    binary = find_chromium()
    if binary is None:
        pytest.skip(f"chromium not found (install it: {CHROMIUM_INSTALL})")
    proc, port = start_chromium(binary, tmp_path / "chromium-profile")
    try:
        with connect(page_target(port), max_size=64 * 1024**2, open_timeout=10) as ws:
            devtools = DevTools(ws)
            devtools.load(index.as_uri(), width=width, height=1000)
            state = devtools.call(
                "Runtime.evaluate", returnByValue=True, awaitPromise=True,
                expression="Promise.all([...document.images].map(i => i.decode().catch(() => 0)))"
                           ".then(() => JSON.stringify({title: document.title,"
                           " height: document.documentElement.scrollHeight,"
                           " width: document.documentElement.scrollWidth,"
                           " boxes: [...document.querySelectorAll('.scroll')].map(b =>"
                           " [b.closest('section') ? b.closest('section').id : '',"
                           " b.scrollWidth, b.clientWidth]),"
                           " images: [...document.images].map(i => [i.getAttribute('src'),"
                           " i.naturalWidth, i.naturalHeight]),"
                           " tables: document.querySelectorAll('table').length}))")
            info = json.loads(state["result"]["value"])
            assert all(w > 0 and h > 0 for _, w, h in info["images"]), info["images"]
            requests = [e["params"]["request"]["url"] for e in devtools.events
                        if e.get("method") == "Network.requestWillBeSent"]
            assert requests and all(u.startswith(("file:", "data:")) for u in requests), requests
            assert page_errors(devtools.events) == []
            height = min(int(info["height"]), 16000)
            devtools.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                          deviceScaleFactor=1, mobile=False)
            shot = devtools.call("Page.captureScreenshot", format="png", timeout=60)
            data = base64.b64decode(shot["data"])
            assert data[:8] == b"\x89PNG\r\n\x1a\n"
            png.write_bytes(data)
            assert page_errors(devtools.events) == []
            return info
    finally:
        stop_process(proc)


def test_report_in_headless_chromium(job_store, tmp_path, output_dir):
    """The report opens in a real headless Chromium without console errors, failed loads or
    any non-file request; every plot image has decoded (naturalWidth > 0); at 1400 px nothing
    is wider than the page and the group tables fit their boxes (every column, p included,
    in view); a full-page screenshot is saved as test-output/report-screenshot.png."""
    from optw.report import write_report

    uri, parent = job_store
    index = write_report(parent, tmp_path / "report", uri)
    info = screenshot_report(index, tmp_path, output_dir / "report-screenshot.png")
    assert info["title"] == "optw job report: optw-report-test"
    assert len(info["images"]) == 6, info["images"]
    assert info["tables"] >= 4
    assert info["width"] <= 1400, info["width"]
    groups = [(w, cw) for section, w, cw in info["boxes"] if section == "tables"][:3]
    assert len(groups) == 3 and all(0 < w <= cw for w, cw in groups), info["boxes"]


def test_finetune_report_in_headless_chromium(finetune_store, tmp_path, output_dir):
    """A global-ft job's report in a real headless Chromium: it opens with the global
    models' learning curves and the fine-tuning before/after chart, both decoded and wide
    enough to read; screenshot test-output/report-finetune-screenshot.png."""
    from optw.report import write_report

    uri, parent = finetune_store
    index = write_report(parent, tmp_path / "report", uri)
    info = screenshot_report(index, tmp_path, output_dir / "report-finetune-screenshot.png")
    assert info["title"] == "optw job report: optw-finetune-test"
    first = {src: (w, h) for src, w, h in info["images"][:2]}
    assert list(first) == ["plots/curves_global.png", "plots/finetune.png"], info["images"]
    assert all(w >= 700 for w, _ in first.values()), first
