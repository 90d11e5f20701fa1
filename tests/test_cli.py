"""Bad input at every entry point of the command line ends in one line naming it: every
command README documents (catalog build/add/show/list, train, solve, baseline, evaluate, job,
tune, serve, plan, report).

Families of bad invocations (generated per option) go through ``optw.cli.main`` in-process
(the console script, ``jobs/train_all.py`` and ``jobs/tune.py`` all end there) and a few
through real subprocesses. Each must exit with code 2 and one ``optw ...: error:`` line that
names the bad option or value, within seconds, without a traceback, without starting Ray and
without writing anything.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from optw.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def sandbox(tmp_path, monkeypatch, tiny_catalog):
    """A working folder where every default output would land (runs/, the MLflow store)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("OPTW_RUNS", str(work / "runs"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    monkeypatch.setenv("OPTW_CATALOG", str(tiny_catalog.path))
    (tmp_path / "a-file").write_text("not a folder")
    bad_model = tmp_path / "bad_model.toml"
    bad_model.write_text("[train]\nregions = ['r199']\n[train.model]\nclipp = 3\n")
    conflict = tmp_path / "conflict.toml"
    conflict.write_text("[train]\nregions = ['pr99']\n")
    points = tmp_path / "points.csv"
    points.write_text("name,x,y,visit_minutes,opens,closes,score\nstart,0,0,0,0,600,0\n"
                      "a,1,1,10,0,600,5\n")
    broken_json = tmp_path / "scores.json"
    broken_json.write_text("[1, 2")
    results = tmp_path / "results.csv"
    results.write_text("region,tourist,method,score\n")
    return {"work": work, "file": tmp_path / "a-file", "bad_model": bad_model,
            "conflict": conflict, "points": points, "broken_json": broken_json,
            "results": results}


def _families(s: dict[str, Path]) -> list[tuple[list[str], str]]:
    """(argv, a word the error must contain) for each bad invocation."""
    f, cases = str(s["file"]), []
    for value, word in (("", "--regions"), (" , ", "--regions"), ("zz9", "zz9")):
        cases.append((["job", "run", "--regions", value], word))
        cases.append((["tune", "--regions", value], word))
    for value, word in (("", "--groups"), ("nope", "nope")):
        cases.append((["job", "run", "--groups", value], word))
    # both would train different regions: refused naming both (the message says which does what)
    cases.append((["job", "run", "--regions", "r199", "--groups", "solomon"],
                  "--regions and --groups"))
    for opt, value, word in (
        ("--profile", "no-such-profile", "no-such-profile"),
        ("--profile", f, "a-file"),
        ("--out", f, "--out"),
        ("--storage", f, "--storage"),
        ("--catalog", "/nonexistent/catalog", "/nonexistent/catalog"),
        ("--tracking-uri", "http://127.0.0.1:9", "127.0.0.1:9"),
        ("--name", "two words", "job.name"),
    ):
        cases.append((["job", "run", "--regions", "r199", opt, value], word))
    for opt, value, word in (
        ("--samples", "0", "--samples"), ("--samples", "-3", "--samples"),
        ("--profile", "no-such-profile", "no-such-profile"), ("--name", "two words", "--name"),
        ("--out", f, "--out"), ("--epochs", "0", "epochs"), ("--val-every", "-1", "--val-every"),
        ("--val-every", "0", "--val-every"), ("--samples", "100000000", "10,000"),
        ("--epochs", str(10**12), "--epochs"),
        ("--catalog", "/nonexistent/catalog", "/nonexistent/catalog"),
    ):
        cases.append((["tune", "--regions", "r199", opt, value], word))
    for opt, value, word in (
        ("--region", "zz9", "zz9"), ("--epochs", "0", "epochs"), ("--epochs", "-5", "epochs"),
        ("--batch-size", "0", "--batch-size"), ("--device", "gpu", "--device"),
        ("--threads", "0", "--threads"), ("--threads", "1000", "--threads"),
        ("--seed", "-5", "--seed"), ("--seed", str(2**40), "--seed"),
        ("--config", "/nonexistent.toml", "/nonexistent.toml"),
        ("--config", str(s["bad_model"]), "clipp"), ("--config", str(s["conflict"]), "differs"),
        ("--resume", None, "--resume"), ("--init", "/nonexistent.pt", "--init"),
        ("--out", f, "--out"),
    ):
        argv = ["train", "--region", "r199", opt] + ([value] if value is not None else [])
        if opt == "--region":
            argv = ["train", opt, value]
        cases.append((argv, word))
    cases += [
        (["catalog", "show", "zz9"], "zz9"),
        (["catalog", "list", "--group", "nope"], "nope"),
        (["catalog", "list", "--catalog", "/nonexistent/catalog"], "/nonexistent/catalog"),
        (["evaluate", "--results", "/nonexistent.csv"], "/nonexistent.csv"),
        (["baseline", "ils", "--regions", "zz9"], "zz9"),
        (["solve", "--region", "r199", "--checkpoint", "/nonexistent.pt"], "/nonexistent.pt"),
    ]
    solve = ["solve", "--region", "r199", "--checkpoint", "/nonexistent.pt"]
    cases += [  # unbounded numbers are refused, naming the option, before any work
        ([*solve, "--active-search", "100000000000"], "--active-search"),
        ([*solve, "--active-search", "-1"], "--active-search"),
        ([*solve, "--samples", "10000000000"], "--samples"),
        ([*solve, "--threads", "1000"], "--threads"), ([*solve, "--threads", "0"], "--threads"),
        ([*solve, "--beams", "129"], "--beams"),
        (["report", "--job", "x", "--tracking-uri", "http://127.0.0.1:9"], "127.0.0.1:9"),
    ]
    work = s["work"]
    nowhere = f"sqlite:///{work / 'nowhere' / 'm.db'}"
    cases += [  # the rest of README's commands: catalog add/build, plan, serve, evaluate, report
        (["catalog", "add", "new1", "--points", "/nonexistent.csv"], "/nonexistent.csv"),
        (["catalog", "add", "new1", "--points", f], "a-file"),
        (["catalog", "add", "c101", "--points", str(s["points"])], "c101"),
        (["catalog", "add", "bad id!", "--points", str(s["points"])], "bad id!"),
        (["catalog", "add", "new1", "--points", str(s["points"]), "--catalog",
          "/nonexistent/catalog"], "/nonexistent/catalog"),
        (["catalog", "build", "--source", "/nonexistent/src", "--out", str(work / "c")],
         "/nonexistent/src"),
        (["catalog", "build", "--out", f], "--out"),
        (["catalog", "build", "--device", "bogus", "--out", str(work / "c")], "--device"),
        (["plan", "--region", "zz9"], "zz9"),
        (["plan", "--region", "r199", "--start", "abc"], "--start"),
        (["plan", "--region", "r199", "--from", "25:99"], "--from"),
        (["plan", "--region", "r199", "--from", "100", "--to", "50"], "--to"),
        (["plan", "--region", "r199", "--method", "magic"], "--method"),
        (["plan", "--region", "r199", "--beams", "129"], "--beams"),
        (["plan", "--region", "r199", "--scores", "/nonexistent.json"], "--scores"),
        (["plan", "--region", "r199", "--scores", str(s["broken_json"])], "--scores"),
        (["plan", "--region", "r199", "--checkpoint", "/nonexistent.pt"], "--checkpoint"),
        (["plan", "--region", "r199", "--preference", "nonsense"], "--preference"),
        (["serve", "--port", "70000"], "--port"), (["serve", "--replicas", "0"], "--replicas"),
        (["serve", "--solve-threads", "0"], "--solve-threads"),
        (["serve", "--check-interval", "-1"], "--check-interval"),
        (["serve", "--registry-timeout", "0"], "--registry-timeout"),
        (["serve", "--request-timeout", "-5"], "--request-timeout"),
        (["serve", "--catalog", "/nonexistent/catalog"], "/nonexistent/catalog"),
        (["serve", "--ray-address", "127.0.0.1:1"], "127.0.0.1:1"),
        (["evaluate", "--results", str(s["results"]), "--out", f], "--out"),
        (["evaluate", "--results", f], "a-file"),
        (["evaluate", "--results", str(s["results"]), "--resamples", "0"], "--resamples"),
        (["evaluate", "--against-paper", "--paper-dir", "/nonexistent/dir"], "/nonexistent/dir"),
        (["evaluate", "--against-paper", "--paper-column", "junk"], "--paper-column"),
        (["report", "--job", "x", "--tracking-uri", nowhere], "does not exist"),
        (["report", "--job", "x", "--out", f], "--out"),
        (["baseline", "ils", "--workers", "0"], "--workers"),
    ]
    return cases


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*"))


def test_bad_invocations_end_in_one_line_naming_the_input(sandbox, capsys):
    """Every generated bad invocation: exit 2, one error line naming the input, no traceback,
    no Ray, nothing written, within seconds."""
    import ray

    problems = []
    for argv, word in _families(sandbox):
        t0 = time.perf_counter()
        code = main(argv)
        took = time.perf_counter() - t0
        out, err = capsys.readouterr()
        lines = [ln for ln in err.splitlines() if ln.strip()]
        ok = (code == 2 and len(lines) == 1 and lines[0].startswith("optw ")
              and ": error: " in lines[0] and word in lines[0] and "Traceback" not in err
              and took < 120)  # a hang guard, not a speed test (the machine may be busy)
        if not ok:
            problems.append(f"{argv}: code {code}, {took:.1f} s, stderr {err!r}")
    assert problems == [], "\n".join(problems)
    assert not ray.is_initialized()
    assert _files(sandbox["work"]) == []


def test_debug_shows_the_traceback_and_keeps_the_exit_code(sandbox, capsys):
    """``optw --debug`` shows a user error's traceback (for bug reports), then its one line,
    and still exits 2 (`optw --debug train --region nope` exited 1)."""
    for name, argv in (("catalog show", ["catalog", "show", "zz9"]),
                       ("train", ["train", "--region", "nope", "--epochs", "1"])):
        capsys.readouterr()
        assert main(["--debug", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("Traceback (most recent call last):"), err
        assert err.splitlines()[-1].startswith(f"optw {name}: error: "), err


def test_a_user_error_is_one_line_and_a_bug_says_it_is_one(sandbox, capsys, monkeypatch):
    """Only the project's own errors (OptwError) are the user's: a real command with bad input
    ends in one line naming it, exit 2. Any other exception is a bug: one line saying it is an
    internal error, with its type, message and the file, line and function it was raised in,
    exit 1; ``--debug`` shows its traceback."""
    import optw.distributed.cli as job_cli

    assert main(["job", "run", "--regions", "r199", "--name", "two words"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("optw job run: error: --name: ") and err.count("\n") == 1, err

    def buggy(args) -> int:
        return {}["no such key"]

    monkeypatch.setattr(job_cli, "_tune", buggy)  # what `optw tune` runs, as a bug would
    assert main(["tune", "--regions", "r199"]) == 1
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("optw tune: internal error (a bug"), err
    assert "KeyError: 'no such key'" in err and "Traceback" not in err
    assert f"{__file__}:" in err and " in buggy" in err
    with pytest.raises(KeyError, match="no such key"):
        main(["--debug", "tune", "--regions", "r199"])


@pytest.mark.parametrize("script,args,word", [
    ("jobs/train_all.py", ["--regions", ""], "--regions"),
    ("jobs/train_all.py", ["--groups", ""], "--groups"),
    ("jobs/tune.py", ["--regions", "r199", "--samples", "0"], "--samples"),
    ("jobs/tune.py", ["--regions", "zz9"], "zz9"),
])
def test_job_scripts_refuse_bad_options_before_ray(sandbox, script, args, word):
    """The Ray entry scripts, as a user runs them: one line, exit 2, no Ray started (a Ray
    start alone takes longer than the limit here)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True,
                          text=True, timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and word in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.perf_counter() - t0 < 60
    assert _files(sandbox["work"]) == []


@pytest.mark.parametrize("argv", [["catalog", "list", "--json"], ["catalog", "show", "c101"]])
def test_broken_pipe_is_quiet(argv):
    """Output into a pipe whose reader has gone (``optw catalog list --json | head``): no
    BrokenPipeError, exit 0."""
    proc = subprocess.Popen([sys.executable, "-m", "optw.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0 and err == "", err


def test_solve_tourist_file_nested_too_deep_is_one_line_naming_the_file(tmp_path):
    """`optw solve --tourist FILE` reads tourist files through the catalog's JSON reader: a file
    nested 100k deep (or with a 5000-digit number) is a ValueError naming the file, not a
    RecursionError."""
    from optw.catalog import open_catalog
    from optw.decode.cli import read_tourists

    region = open_catalog().region("c101")
    for name, text in (("deep.json", "[" * 100_000 + "]" * 100_000),
                       ("huge.json", '{"t_start": ' + "9" * 5000 + "}")):
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(ValueError, match=f"tourist file {path}") as info:
            read_tourists(path, region)
        assert "\n" not in str(info.value)


def test_an_unknown_tracking_scheme_is_a_user_error(sandbox, capsys, monkeypatch):
    """A tracking URI of a scheme MLflow has no store for (`--tracking-uri bogus://x` of a
    job, `MLFLOW_TRACKING_URI=bogus://x` of a report) is one line, exit 2, naming the option
    or the variable and what is accepted (MLflow's exception was an internal error); no Ray,
    nothing written."""
    import ray

    assert main(["job", "run", "--regions", "r199", "--tracking-uri", "bogus://x"]) == 2
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "bogus://x")
    assert main(["report"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    for line, command, source in zip(lines, ("job run", "report"),
                                     ("--tracking-uri", "$MLFLOW_TRACKING_URI"), strict=True):
        assert line.startswith(f"optw {command}: error: {source} bogus://x: MLflow has no "
                               "store for the scheme 'bogus'; give an MLflow server"), line
        assert "sqlite:///PATH" in line and "internal error" not in line, line
    assert not ray.is_initialized()
    assert _files(sandbox["work"]) == []


def test_a_job_with_nothing_left_to_train_names_no_empty_run():
    """The summary of a job whose every region was skipped (no parent run) says so, instead of
    naming a parent run with an empty id."""
    from optw.distributed.cli import format_summary
    from optw.distributed.job import JobSummary

    text = format_summary(JobSummary("j", "", "sqlite:///x.db", [], ["c101"], None, {}, 1.0))
    assert "parent run  in" not in text and "no run of this job" in text
    assert "1 region(s) skipped" in text
