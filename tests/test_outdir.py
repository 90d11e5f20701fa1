"""Output folders of every command that writes one (``--out``): a folder holding a user's
file, another command's output or another job's is refused in one line naming it, and nothing
in it changes; a second run into the command's own output folder replaces its own output
(nothing stale of it stays) and keeps every file of the user's there.

Commands: ``optw catalog build``, ``python -m optw.catalog.paper_sets``, ``optw evaluate``
(tables and ``--against-paper``), ``optw report``, ``optw train``, ``optw job run`` (refused
before Ray starts); the shared rules in :mod:`optw.outdir`. Real files, real catalogs of tiny
regions and a real MLflow store; no Ray.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from conftest import copy_catalog, write_tiny_source

USER_FILE = "mine.txt"


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path -> SHA-256 of its bytes)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def user_folder(tmp_path: Path, name: str = "users") -> Path:
    """A folder holding one file of the user's."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / USER_FILE).write_text("my notes, keep them\n")
    return folder


def assert_refused(run: Callable[[Path], int], folder: Path, capsys, prefix: str) -> None:
    """``run(folder)`` exits 2 with one line ``<prefix> --out <folder>: ...`` naming the user's
    file; the folder, and its parent, are exactly as before."""
    before, around = snapshot(folder), sorted(p.name for p in folder.parent.iterdir())
    capsys.readouterr()
    assert run(folder) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"{prefix} --out {folder}: holds other files ({USER_FILE})"), err
    assert snapshot(folder) == before
    assert sorted(p.name for p in folder.parent.iterdir()) == around  # no temporary folders


# ----------------------------------------------------------------------------- catalog build


def test_catalog_build_out(tmp_path, capsys):
    """`optw catalog build --out`: a folder of a user's file is refused, a file too; a new
    folder, one holding only the project's catalog README, and a built catalog (again, with
    its custom regions' folder and ILS results kept) are built into."""
    from optw.catalog import Catalog
    from optw.cli import main

    src = write_tiny_source(tmp_path / "src")

    def build(out: Path) -> int:
        return main(["catalog", "build", "--source", str(src), "--out", str(out), "--quiet"])

    assert_refused(build, user_folder(tmp_path), capsys, "optw catalog build: error:")
    afile = tmp_path / "catalog.txt"
    afile.write_text("not a folder")
    assert build(afile) == 2
    assert f"--out {afile}: is a file" in capsys.readouterr().err
    assert afile.read_text() == "not a folder"

    fresh = tmp_path / "fresh"
    assert build(fresh) == 0 and len(Catalog(fresh)) == 3
    readme = tmp_path / "with-readme"
    readme.mkdir()
    (readme / "README.md").write_text("# the catalog's schema\n")
    assert build(readme) == 0 and (readme / "README.md").read_text() == "# the catalog's schema\n"
    (fresh / "baselines").mkdir()
    (fresh / "baselines" / "kept.parquet").write_bytes(b"x")
    first = sorted(p.name for p in fresh.iterdir())
    assert build(fresh) == 0  # its own folder: rebuilt in place
    assert sorted(p.name for p in fresh.iterdir()) == first
    assert (fresh / "baselines" / "kept.parquet").read_bytes() == b"x"
    assert len(Catalog(fresh)) == 3


# ----------------------------------------------------------------------------- paper sets


def test_paper_sets_out(tiny_catalog, tmp_path, capsys):
    """`python -m optw.catalog.paper_sets --out`: a folder of a user's file is refused (one
    line, exit 2); a new folder gets the sets; a second run replaces its own output and keeps
    the file a user put beside it."""
    from optw.catalog.paper_sets import main
    from optw.catalog.tables import PAPER_FILE

    def run(out: Path) -> int:
        return main(["--device", "cpu", "--catalog", str(tiny_catalog.path), "--groups",
                     "cordeau", "--out", str(out)])

    assert_refused(run, user_folder(tmp_path), capsys, "paper_sets: error:")
    out = tmp_path / "sets"
    assert run(out) == 0 and (out / PAPER_FILE).is_file()
    (out / USER_FILE).write_text("mine")
    (out / PAPER_FILE).write_bytes(b"an earlier output")
    assert run(out) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([".optw-paper-sets", PAPER_FILE,
                                                            USER_FILE])
    assert (out / USER_FILE).read_text() == "mine"
    assert (out / PAPER_FILE).read_bytes() != b"an earlier output"


# ----------------------------------------------------------------------------- evaluate


@pytest.fixture(scope="module")
def evaluation_setup(tiny_catalog, tmp_path_factory) -> tuple[Path, Path, Path, Path]:
    """(catalog copy with a hand-made ILS store, reference CSV, results of two tourist kinds,
    results of validation tourists only)."""
    from optw.baselines import write_ils_results
    from optw.baselines.ils import ILS_VERSION

    root = tmp_path_factory.mktemp("evaluate-out")
    cat = copy_catalog(tiny_catalog, root / "catalog")
    pairs = [("r199", t) for t in range(3)] + [("pr99", t) for t in range(3)]
    write_ils_results(cat, pd.DataFrame([
        {"region": r, "tourist": t, "kind": "benchmark" if t == 0 else "validation",
         "score": 10.0 + t, "route": [0], "seconds": 0.01, "iterations": 10,
         "ils_version": ILS_VERSION} for r, t in pairs]))
    ref = root / "ref.csv"
    pd.DataFrame({"instance": ["r199", "pr99"], "best_known": [20.0, 20.0]}).to_csv(ref,
                                                                                  index=False)
    both, val = root / "both.csv", root / "val.csv"
    rows = pd.DataFrame([{"region": r, "tourist": t, "method": "m", "score": 9.0 + t,
                          "seconds": 0.1} for r, t in pairs])
    rows.to_csv(both, index=False)
    rows[rows["tourist"] > 0].to_csv(val, index=False)
    return cat, ref, both, val


def test_evaluate_out(evaluation_setup, tmp_path, capsys):
    """`optw evaluate --out`: a folder of a user's file (a `summary.md` of theirs too) is
    refused; a second evaluation into its own folder replaces its own output: the benchmark
    table of the first one does not stay beside the tables of one of validation tourists only,
    and the notes a user put there stay."""
    from optw.cli import main

    cat, ref, both, val = evaluation_setup

    def run(out: Path, results: Path = both) -> int:
        return main(["evaluate", "--results", str(results), "--out", str(out), "--catalog",
                     str(cat), "--reference", str(ref), "--quiet"])

    assert_refused(run, user_folder(tmp_path), capsys, "optw evaluate: error:")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "summary.md").write_text("my summary\n")
    assert run(theirs) == 2 and "holds other files (summary.md)" in capsys.readouterr().err
    assert (theirs / "summary.md").read_text() == "my summary\n"

    out = tmp_path / "tables"
    assert run(out) == 0 and (out / "regions_benchmark.md").is_file()
    (out / "notes.txt").write_text("my notes\n")
    assert run(out, val) == 0
    names = {p.name for p in out.iterdir()}
    assert "regions_benchmark.md" not in names and "regions_generated.md" in names
    assert ".optw-evaluation" in names and (out / "notes.txt").read_text() == "my notes\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run(empty) == 0 and (empty / "summary.csv").is_file()


def test_evaluate_default_out_is_checked_too(evaluation_setup, tmp_path, capsys, monkeypatch):
    """Without --out the default folder (outputs/evaluate/<results stem>) follows the same
    rule: one of a user's files is refused, naming it and the way out (--out DIR)."""
    from optw.cli import main

    cat, ref, both, _ = evaluation_setup
    monkeypatch.chdir(tmp_path)
    default = tmp_path / "outputs" / "evaluate" / both.stem
    default.mkdir(parents=True)
    (default / USER_FILE).write_text("mine")
    assert main(["evaluate", "--results", str(both), "--catalog", str(cat), "--reference",
                 str(ref), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and USER_FILE in err and "--out DIR" in err, err
    assert [p.name for p in default.iterdir()] == [USER_FILE]


# ----------------------------------------------------------------------------- report


def test_report_out(tmp_path, capsys):
    """`optw report --out`: a folder of a user's file is refused; a second report into its
    own folder replaces its own output (a plot it no longer draws goes) and keeps a user's
    file; a report folder from before the marker (only index.html and plots/) is replaced
    too."""
    from optw.cli import main
    from test_report import make_job_store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = make_job_store(uri, "optw-outdir-test")

    def run(out: Path) -> int:
        return main(["report", "--run", parent, "--tracking-uri", uri, "--out", str(out)])

    assert_refused(run, user_folder(tmp_path), capsys, "optw report: error:")
    out = tmp_path / "report"
    assert run(out) == 0
    (out / "plots" / "stale.png").write_bytes(b"old")
    (out / USER_FILE).write_text("mine")
    assert run(out) == 0 and not (out / "plots" / "stale.png").exists()
    assert (out / USER_FILE).read_text() == "mine"
    legacy = tmp_path / "legacy"
    (legacy / "plots").mkdir(parents=True)
    (legacy / "index.html").write_text("<html></html>")
    assert run(legacy) == 0 and (legacy / ".optw-report").is_file()


# ----------------------------------------------------------------------------- the rules


def test_replace_dir_rules(tmp_path):
    """optw.outdir: an absent, empty or marked folder is replaced (with a marker listing its
    output); a user's file in it goes across untouched, one where the output writes is refused;
    a file, a folder of other files, a folder of another kind and one of another name are
    refused naming the option; a failure inside leaves the earlier output, the user's file and
    no temporary folder."""
    from optw.errors import UserError
    from optw.outdir import OutDirError, check_out_dir, marker, read_marker, replace_dir

    out = tmp_path / "out"
    with replace_dir(out, "thing", "first") as tmp:
        (tmp / "a.txt").write_text("1")
    assert (out / marker("thing")).read_text() == "optw thing: first\noutput: a.txt\n"
    (out / USER_FILE).write_text("mine")
    with replace_dir(out, "thing") as tmp:
        (tmp / "b.txt").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == [marker("thing"), "b.txt", USER_FILE]
    assert read_marker(out / marker("thing")).output == {"b.txt"}
    with pytest.raises(OutDirError, match=r"^--out .*out: holds a thing's output \(\.optw-thing"
                       r"\), not an other's; choose a new or an empty folder$"):
        check_out_dir(out, "other", option="--out")
    with pytest.raises(RuntimeError, match="boom"), replace_dir(out, "thing") as tmp:
        (tmp / "c.txt").write_text("3")
        raise RuntimeError("boom")
    with pytest.raises(OutDirError, match=rf"holds other files \({USER_FILE}\) where a thing "
                       "writes its own"), replace_dir(out, "thing") as tmp:
        (tmp / USER_FILE).write_text("the output's")
    assert sorted(p.name for p in out.iterdir()) == [marker("thing"), "b.txt", USER_FILE]
    assert (out / USER_FILE).read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(UserError, match="is a file"):
        check_out_dir(afile, "thing")
    blocked = afile / "sub"
    with pytest.raises(OutDirError, match="cannot be written"), replace_dir(blocked, "thing"):
        pass
    if os.geteuid() != 0:  # root reads every folder
        locked = tmp_path / "locked"
        locked.mkdir(mode=0)
        try:
            with pytest.raises(OutDirError, match="cannot be listed"):
                check_out_dir(locked, "thing")
        finally:
            locked.chmod(0o755)


def test_names_and_markers_from_before_listing(tmp_path):
    """A marker naming its owner (a job's) refuses another name and takes its own; a marker
    from before markers listed their output counts what the output writes again as its own
    (replaced) and anything else as the user's (kept); no message claims a command replaces
    a folder of other files."""
    from optw.outdir import OutDirError, check_out_dir, marker, replace_dir, write_marker

    job = tmp_path / "job"
    job.mkdir()
    write_marker(job, "job", ["models"], name="a")
    assert check_out_dir(job, "job", name="a") == job
    with pytest.raises(OutDirError, match=r"holds the output of job 'a', not of job 'b'"):
        check_out_dir(job, "job", option="--out", name="b")
    old = tmp_path / "old"
    old.mkdir()
    (old / marker("thing")).write_text("optw thing: from before listing\n")
    (old / "table.csv").write_text("old table")
    (old / USER_FILE).write_text("mine")
    with replace_dir(old, "thing") as tmp:
        (tmp / "table.csv").write_text("new table")
    assert (old / "table.csv").read_text() == "new table"
    assert (old / USER_FILE).read_text() == "mine"
    other = tmp_path / "other"
    other.mkdir()
    (other / USER_FILE).write_text("mine")
    with pytest.raises(OutDirError) as exc:
        check_out_dir(other, "train", option="--out")
    assert str(exc.value) == (f"--out {other}: holds other files ({USER_FILE}) and is not a "
                              "train folder; choose a new or an empty folder")


# ----------------------------------------------------------------------------- one command's
# folder to another


@pytest.fixture
def outputs(evaluation_setup, tiny_catalog, tmp_path) -> dict[str, Path]:
    """A real folder of each kind: an evaluation, a report, a train run and a job's (as a
    job marks it), by kind."""
    from optw.cli import main
    from optw.distributed.job import OUT_ENTRIES, OUT_KIND
    from optw.outdir import write_marker
    from test_report import make_job_store

    cat, ref, both, _ = evaluation_setup
    found = {k: tmp_path / k for k in ("evaluation", "report", "train", "job")}
    assert main(["evaluate", "--results", str(both), "--out", str(found["evaluation"]),
                 "--catalog", str(cat), "--reference", str(ref), "--quiet"]) == 0
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["report", "--run", make_job_store(uri, "optw-outdir-kinds"), "--tracking-uri",
                 uri, "--out", str(found["report"])]) == 0
    assert main(["train", "--region", "r199", "--epochs", "1", "--batch-size", "4",
                 "--threads", "1", "--catalog", str(tiny_catalog.path), "--out",
                 str(found["train"])]) == 0
    found["job"].mkdir()
    (found["job"] / "results.parquet").write_bytes(b"job a's results")
    write_marker(found["job"], OUT_KIND, OUT_ENTRIES, name="a")
    return found


def test_a_command_never_writes_into_another_commands_folder(outputs, evaluation_setup,
                                                             tiny_catalog, tmp_path, capsys):
    """`optw evaluate`, `optw report`, `optw train` and `optw job run --out` into another
    command's folder, and `optw job run --name b` into job a's, are refused in one line
    naming --out and what the folder holds (a job before Ray starts); nothing there
    changes. Job a's own folder, and one from before markers, pass the job's check."""
    import ray

    from optw.cli import main
    from optw.distributed.job import job_out_dir

    cat, ref, both, _ = evaluation_setup
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    runs = {
        "evaluation": lambda out: ["evaluate", "--results", str(both), "--out", str(out),
                                   "--catalog", str(cat), "--reference", str(ref), "--quiet"],
        "report": lambda out: ["report", "--job", "optw-outdir-kinds", "--tracking-uri", uri,
                               "--out", str(out)],
        "train": lambda out: ["train", "--region", "r199", "--epochs", "1", "--catalog",
                              str(tiny_catalog.path), "--out", str(out)],
        "job": lambda out: ["job", "run", "--profile", "smoke", "--regions", "r199",
                            "--catalog", str(tiny_catalog.path), "--name", "b", "--out",
                            str(out), "--tracking-uri", uri],
    }
    before = {kind: snapshot(folder) for kind, folder in outputs.items()}
    for kind, argv in runs.items():
        for other, folder in outputs.items():
            if other == kind and kind != "job":
                continue
            capsys.readouterr()
            assert main(argv(folder)) == 2, (kind, other)
            err = capsys.readouterr().err
            held = "the output of job 'a'" if other == kind else f"{other}'s output"
            assert err.count("\n") == 1 and f"error: --out {folder}: holds " in err, err
            assert held in err and "as a whole" not in err, err
    assert {kind: snapshot(folder) for kind, folder in outputs.items()} == before
    assert not ray.is_initialized()
    assert job_out_dir(str(outputs["job"]), "a", "--out") == outputs["job"]
    legacy = tmp_path / "legacy-job"
    (legacy / "models").mkdir(parents=True)
    (legacy / "results.parquet").write_bytes(b"x")
    assert job_out_dir(str(legacy), "b", "--out") == legacy
    assert job_out_dir("s3://bucket/jobs/b", "b", "--out") is None  # a URI: not checked here
