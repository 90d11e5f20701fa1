"""The planner as a new user meets it, without a server: `optw plan`'s options and table,
request parsing at its edges (huge numbers, huge echoes, non-ASCII digits), and what `optw
serve` lets reach the terminal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from optw.cli import main
from optw.serve import PlanError, Planner, parse_time


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    import torch

    from optw.model import ModelConfig, PointerNet, save_model

    torch.manual_seed(5)
    return save_model(PointerNet(ModelConfig()), tmp_path_factory.mktemp("plan") / "m.pt")


def _plan(catalog, checkpoint, *args: str) -> list[str]:
    return ["plan", "--catalog", str(catalog.path), "--checkpoint", str(checkpoint),
            "--method", "greedy", *args]


def test_plan_takes_negative_coordinates_and_times(tiny_catalog, checkpoint, capsys):
    """`optw plan --start -3,-4` (argparse took it for an option: "expected one argument")
    and `--start=-3,-4` both plan from (-3, -4); a negative --from is a value too (and then
    refused as outside the day, naming --from)."""
    for start in (["--start", "-3,-4"], ["--start=-3,-4"], ["--start", "-3.5,-.5"]):
        assert main(_plan(tiny_catalog, checkpoint, "--region", "r199", *start,
                          "--json")) == 0, start
        ans = json.loads(capsys.readouterr().out)
        x, y = start[-1].split("=")[-1].split(",")
        assert (ans["start"]["x"], ans["start"]["y"]) == (float(x), float(y))
    assert main(_plan(tiny_catalog, checkpoint, "--region", "r199", "--from", "-5")) == 2
    err = capsys.readouterr().err
    assert err.startswith("optw plan: error: --from") and "outside the day" in err, err


def test_plan_table_has_one_label_per_column_and_says_what_a_clock_time_means(
        tiny_catalog, checkpoint, capsys):
    """The itinerary's header has one label over each column (it had four labels, "arrive
    start visit leave", over three time columns); on a region counted from the depot's
    opening (r199, like the Solomon regions) a note says what HH:MM means there; a Gavalas
    region (t199) has no note."""
    assert main(_plan(tiny_catalog, checkpoint, "--region", "r199", "--from", "01:00")) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(ln for ln in out if ln.lstrip().startswith("stop"))
    assert header.split() == ["stop", "place", "arrive", "begin", "leave", "score"]
    rows = [ln for ln in out[out.index(header) + 1:] if ln.strip()]
    width = len(header)
    assert all(len(r) <= width for r in rows), (header, rows)
    for r in rows:  # each cell ends where its label ends
        for label in ("arrive", "begin", "leave", "score"):
            end = header.index(label) + len(label)
            assert r[end:end + 1] in ("", " "), (label, r)
    note = [ln for ln in out if ln.startswith("Note: ")]
    assert len(note) == 1 and "opening" in note[0] and "09:00 = 540 min" in note[0]
    assert main(_plan(tiny_catalog, checkpoint, "--region", "t199", "--from", "09:00")) == 0
    assert "Note: " not in capsys.readouterr().out


def test_regions_say_where_their_clock_starts(tiny_catalog, catalog):
    """/regions and /regions/{id} say what 0 minutes is (clock_origin): the depot's opening
    for Solomon and Cordeau regions (c101's day was shown as 00:00-24:02, as if a clock day),
    midnight for the Gavalas ones; the answer carries it too."""
    planner = Planner(catalog, models=None)
    by_id = {r["region"]: r for r in planner.regions()}
    assert by_id["c101"]["clock_origin"] == "opening"
    assert by_id["pr01"]["clock_origin"] == "opening"
    assert by_id["t101"]["clock_origin"] == "midnight"
    c101 = planner.region("c101")
    assert c101["clock_origin"] == "opening" and "opening" in c101["clock_note"]
    assert planner.region("t101")["clock_note"] is None


def test_a_model_of_other_regions_is_named_once_per_model_and_region(tiny_catalog, tmp_path,
                                                                    caplog, capsys):
    """The planner warns, in one line naming both, when the model it uses for a region was
    trained on other regions (a file that says which: optw.model.load_model), once per model
    and region; a model of the region, or one whose file does not say, is not named.
    `optw plan --checkpoint` shows that line on its terminal."""
    import torch

    from optw.model import ModelConfig, PointerNet, save_model
    from optw.serve import CheckpointModels

    torch.manual_seed(5)
    path = save_model(PointerNet(ModelConfig()), tmp_path / "r199.pt", train={"regions": ["r199"]})
    planner = Planner(tiny_catalog, CheckpointModels(path))
    request = {"region": "pr99", "method": "greedy"}
    with caplog.at_level("WARNING", logger="optw.serve.planner"):
        for body in (request, request, {**request, "region": "r199"}):
            planner.plan(body)
    warned = [r.getMessage() for r in caplog.records if r.name == "optw.serve.planner"]
    assert len(warned) == 1, warned
    assert "trained on r199, not on pr99 (cordeau)" in warned[0] and str(path) in warned[0]
    assert main(_plan(tiny_catalog, path, "--region", "t199")) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: the model was trained on r199, not on t199 (gavalas)")
    assert err.count("\n") == 1, err


def test_request_edges_are_refused_briefly(tiny_catalog):
    """Arabic-Indic digits are not a clock time (they were read as 09:00); beams = 10**5000
    (valid JSON) is "out of range", not malformed JSON; a 200 KB unknown key or preference is
    echoed cut short; non-JSON content types are refused with 415."""
    from optw.serve.app import check_content_type

    for bad in ("\u0660\u0669:\u0663\u0660", "\u0669:00", "09:\u0663\u0660"):
        with pytest.raises(PlanError) as err:
            parse_time(bad, "t_start")
        assert err.value.status == 422 and err.value.field == "t_start"
    assert parse_time("09:30", "t_start") == (570.0, True)
    planner = Planner(tiny_catalog, models=None)
    big = "k" * 200_000
    for body, field in ((b'{"region": "r199", "beams": 1' + b"0" * 5000 + b"}", "beams"),
                        (b'{"region": "r199", "beams": ' + b"9" * 401 + b"}", "beams"),
                        (json.dumps({"region": "r199", big: 1}).encode(), None),
                        (json.dumps({"region": "r199", "preference": big}).encode(),
                         "preference"),
                        (json.dumps({"region": "r199", "start": {big: 1}}).encode(), "start")):
        with pytest.raises(PlanError) as err:
            planner.parse(body)
        got = err.value.to_dict()
        assert got["status"] == 422 and len(json.dumps(got)) < 1000, got
        if field:
            assert got["field"] == field, got
    with pytest.raises(PlanError, match="out of range"):
        planner.parse(b'{"region": "r199", "beams": 1' + b"0" * 5000 + b"}")
    for ctype in ("text/plain", "", None, "application/jsonx"):
        with pytest.raises(PlanError) as err:
            check_content_type(ctype)
        assert err.value.status == 415 and err.value.field == "content-type"
    check_content_type("application/json")
    check_content_type("Application/JSON; charset=utf-8")


def test_serve_options_take_ascii_digits_only(tiny_catalog, capsys):
    """`optw serve --port ٨٠٠٠` (Arabic-Indic digits, which int() reads as 8000) is refused
    naming --port, before Ray."""
    for argv, option in ((["--port", "\u0668\u0660\u0660\u0660"], "--port"),
                         (["--check-interval", "\u0661"], "--check-interval")):
        assert main(["serve", "--catalog", str(tiny_catalog.path), *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"optw serve: error: {option}: "), err


def test_serve_filters_ray_internals_from_its_output():
    """What `optw serve` installs (optw.raylogs): Ray's internal start/stop lines (the
    mutex.cc RAW line from C++, ServeController.graceful_shutdown, "Connecting to existing
    Serve app") are dropped from stdout and stderr, written from Python or straight to the
    file descriptor; every other line, Serve's warnings included, passes unchanged."""
    code = """if True:
        import logging, os
        from optw.raylogs import filter_ray_noise
        filter_ray_noise()
        print("trip planner listening on http://127.0.0.1:8000", flush=True)
        print("(raylet) Task ServeController.graceful_shutdown failed. There are infinite "
              "retries remaining", flush=True)
        os.write(2, b"[2026-01-01 00:00:00,000 E 1 2] [mutex.cc : 452] RAW: Lock blocking\\n")
        os.write(2, b"Token authentication is enabled for this Ray cluster. Set RAY\\n")
        os.write(2, b"a real error\\n")
        logging.basicConfig()
        log = logging.getLogger("ray.serve")
        log.info('Connecting to existing Serve app in namespace "serve". New http_options')
        log.warning("a Serve warning")
        print("stopping the trip planner", flush=True)
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["trip planner listening on http://127.0.0.1:8000",
                                        "stopping the trip planner"]
    assert proc.stderr.splitlines() == ["a real error", "WARNING:ray.serve:a Serve warning"]
