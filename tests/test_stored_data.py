"""Stored data is checked when read: the stores of ``<catalog>/baselines/`` (ILS results,
demonstrations) that are truncated, another store's file, hold a bad row or belong to a region
whose content changed give one line naming the file (and region and tourist) and the command
that clears them, exit 2; `optw catalog remove` and `optw baseline clear` clear them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import copy_catalog
from optw.baselines.demos import demos_path, get_demos
from optw.baselines.ils import ILS_VERSION
from optw.baselines.store import (
    SCHEMA,
    StoreError,
    ils_store_path,
    load_ils_results,
    run_ils_baseline,
)
from optw.catalog import open_catalog
from optw.catalog.store import add_region, remove_region
from optw.cli import main

FIX = Path(__file__).parent / "fixtures" / "custom"
CONFIG = """epochs = 1
batch_size = 4
val_every = 0
val_tourists = 2
checkpoint_every = 0
threads = 1
device = "cpu"
demos = 8
imitation_epochs = 2
imitation_batch = 4
"""


@pytest.fixture()
def cat(tiny_catalog, tmp_path) -> Path:
    """A private copy of the tiny catalog (its stores are written beside it)."""
    return copy_catalog(tiny_catalog, tmp_path / "catalog")


def _train(cat: Path, region: str, out: Path, capsys) -> tuple[int, str]:
    """`optw train` of ``region`` with 8 demonstrations and 2 imitation steps: (exit, stderr)."""
    config = out.parent / "imitate.toml"
    config.write_text(CONFIG)
    code = main(["train", "--region", region, "--config", str(config), "--catalog", str(cat),
                 "--out", str(out)])
    return code, capsys.readouterr().err


def _edit_route(path: Path, region: str, edit) -> int:
    """Rewrite the first stored route of ``region`` with two visits or more with
    ``edit(route)``; its tourist id."""
    table = pq.read_table(path)
    df = table.to_pandas()
    i = int(df.index[(df["region"] == region) & (df["route"].map(len) > 3)][0])
    df.at[i, "route"] = edit([int(v) for v in df.at[i, "route"]])
    pq.write_table(pa.Table.from_pandas(df, schema=table.schema, preserve_index=False), path)
    return int(df.at[i, "tourist"])


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:300])


def test_demonstration_with_a_node_out_of_range_stops_optw_train(cat, tmp_path, capsys):
    """A stored demonstration visiting node 999 stops `optw train` (exit 2) naming the file,
    region and tourist and the command that clears the region's rows; after it, training
    recomputes them."""
    assert _train(cat, "t199", tmp_path / "a", capsys)[0] == 0
    path = demos_path(cat)
    tourist = _edit_route(path, "t199", lambda r: [r[0], 999, *r[1:]])
    code, err = _train(cat, "t199", tmp_path / "b", capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"demonstration of t199 tourist {tourist} visits nodes [999]" in err
    assert str(path) in err and f"optw baseline clear --store demos --regions t199 " \
        f"--catalog {cat}" in err
    assert main(["baseline", "clear", "--store", "demos", "--regions", "t199", "--catalog",
                 str(cat)]) == 0
    assert _train(cat, "t199", tmp_path / "c", capsys)[0] == 0


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda r: [*r[:-1], 999], "visits nodes [999]"),
    (lambda r: [r[0], r[1], *r[1:]], "visited more than once"),
    (lambda r: [r[0], *r[2:]], "claimed score"),
    (lambda r: [r[-1], *r[1:]], "not at the start node 0"),
])
def test_every_stored_route_is_checked_by_the_route_validator(cat, edit, problem):
    """Each stored demonstration read back is checked: nodes in range, none repeated, its
    schedule admissible and its score the route's (the route validator); a bad one is a
    StoreError naming the file, region and tourist."""
    rid = "pr99"
    get_demos(open_catalog(cat), [rid], 8, seed=2)
    path = demos_path(cat)
    tourist = _edit_route(path, rid, edit)
    with pytest.raises(StoreError, match=re.escape(problem)) as info:
        get_demos(open_catalog(cat), [rid], 8, seed=2)
    assert f"demonstration of {rid} tourist {tourist}" in str(info.value)
    assert str(path) in str(info.value)


def test_demonstration_scores_of_another_length_are_refused(cat):
    """A stored demonstration whose scores are not one per node of its region is a StoreError
    naming region and tourist (not a shape error in training)."""
    get_demos(open_catalog(cat), ["r199"], 4, seed=1)
    path = demos_path(cat)
    table = pq.read_table(path)
    df = table.to_pandas()
    df.at[0, "scores"] = list(df.at[0, "scores"])[:-1]
    pq.write_table(pa.Table.from_pandas(df, schema=table.schema, preserve_index=False), path)
    with pytest.raises(StoreError, match=f"r199 tourist {df.at[0, 'tourist']} has scores"):
        get_demos(open_catalog(cat), ["r199"], 4, seed=1)


def test_truncated_stores_are_user_errors(cat, tmp_path, capsys):
    """A truncated demos.parquet stops `optw train`, a truncated ils.parquet `optw baseline
    ils`: one line naming the file and the `optw baseline clear` that clears it, exit 2; the
    clear command then lets them run."""
    assert _train(cat, "r199", tmp_path / "a", capsys)[0] == 0
    _truncate(demos_path(cat))
    code, err = _train(cat, "r199", tmp_path / "b", capsys)
    assert code == 2 and "internal error" not in err
    assert f"{demos_path(cat)} cannot be read" in err
    assert f"optw baseline clear --store demos --catalog {cat}" in err

    ils = ["baseline", "ils", "--catalog", str(cat), "--regions", "r199", "--tourists",
           "benchmark", "--workers", "1", "--quiet"]
    assert main(ils) == 0
    _truncate(ils_store_path(cat))
    capsys.readouterr()
    assert main(ils) == 2
    err = capsys.readouterr().err
    assert f"{ils_store_path(cat)} cannot be read as an ILS results store" in err
    assert f"optw baseline clear --store ils --catalog {cat}" in err
    assert main(["baseline", "clear", "--catalog", str(cat)]) == 0
    assert not (cat / "baselines" / "ils.parquet").exists()
    assert not demos_path(cat).exists()
    assert main(ils) == 0 and _train(cat, "r199", tmp_path / "c", capsys)[0] == 0


def test_another_stores_file_is_a_user_error(cat, tmp_path, capsys):
    """ils.parquet copied over demos.parquet (and back the other way) is refused naming the
    file and the columns it lacks; an ILS store holding the paper's kind, or a column of
    another kind, is refused too."""
    assert main(["baseline", "ils", "--catalog", str(cat), "--regions", "r199", "--tourists",
                 "benchmark", "--workers", "1", "--quiet"]) == 0
    ils, demos = ils_store_path(cat), demos_path(cat)
    demos.write_bytes(ils.read_bytes())
    code, err = _train(cat, "r199", tmp_path / "a", capsys)
    assert code == 2 and f"{demos} is not a demonstrations store: it lacks column(s) seed" in err

    demos.unlink()
    get_demos(open_catalog(cat), ["r199"], 4, seed=1)
    ils.write_bytes(demos.read_bytes())
    with pytest.raises(StoreError, match="is not an ILS results store: it lacks column"):
        load_ils_results(cat)
    results = tmp_path / "results.csv"
    results.write_text("region,tourist,method,score,seconds\nr199,0,m,1.0,0.1\n")
    assert main(["evaluate", "--results", str(results), "--catalog", str(cat), "--out",
                 str(tmp_path / "eval"), "--quiet"]) == 2
    assert f"{ils} is not an ILS results store" in capsys.readouterr().err

    rows = {"region": ["r199"], "tourist": [0], "kind": ["paper"], "score": [1.0],
            "route": [[0, 11]], "seconds": [0.1], "iterations": [1],
            "ils_version": [ILS_VERSION]}
    pq.write_table(pa.table(rows, schema=SCHEMA), ils)
    with pytest.raises(StoreError, match="holds rows of kind paper"):
        load_ils_results(cat)
    pq.write_table(pa.table({**rows, "kind": ["benchmark"], "score": ["high"]}), ils)
    with pytest.raises(StoreError, match="score is string, not double"):
        load_ils_results(cat)


def test_remove_and_re_add_with_other_points_recomputes(cat, tmp_path, capsys):
    """A region removed and added again with another number of points: `optw catalog remove`
    drops its demonstrations and ILS results (the other regions' stay), and training with
    demonstrations after the re-add works on the new points."""
    assert main(["catalog", "add", "town", "--points", str(FIX / "town.csv"), "--catalog",
                 str(cat)]) == 0
    assert _train(cat, "town", tmp_path / "a", capsys)[0] == 0
    assert _train(cat, "r199", tmp_path / "b", capsys)[0] == 0
    run_ils_baseline(cat, regions=["town", "r199"], tourists="benchmark", workers=1,
                     progress=False)
    assert main(["catalog", "remove", "town", "--catalog", str(cat)]) == 0
    assert set(pd.read_parquet(demos_path(cat))["region"]) == {"r199"}
    assert set(pq.read_table(ils_store_path(cat))["region"].to_pylist()) == {"r199"}
    assert main(["catalog", "add", "town", "--points", str(FIX / "grid.csv"), "--catalog",
                 str(cat)]) == 0
    capsys.readouterr()
    code, err = _train(cat, "town", tmp_path / "c", capsys)
    assert code == 0, err
    n = open_catalog(cat).region("town").n_nodes
    stored = pd.read_parquet(demos_path(cat)).query("region == 'town'")
    assert len(stored) == 8 and {len(s) for s in stored["scores"]} == {n}


def test_rows_of_a_region_whose_content_changed_are_recomputed(cat, tmp_path):
    """Stored rows carry their region's content hash: demonstrations and ILS results of a
    region that was replaced behind the store's back (here: the old store put back after a
    re-add with other points) are stale, recomputed and replaced, never used."""
    add_region("town", FIX / "town.csv", catalog=cat)
    get_demos(open_catalog(cat), ["town"], 4, seed=1)
    run_ils_baseline(cat, regions=["town"], tourists="benchmark", workers=1, progress=False)
    old_demos = demos_path(cat).read_bytes()
    old_ils = pq.read_table(ils_store_path(cat))
    remove_region("town", cat)
    add_region("town", FIX / "grid.csv", catalog=cat)
    demos_path(cat).write_bytes(old_demos)
    meta = dict(old_ils.schema.metadata)
    meta[b"optw.catalog_tourists_sha256"] = \
        open_catalog(cat).manifest["files"]["tourists.parquet"].encode()
    pq.write_table(old_ils.replace_schema_metadata(meta), ils_store_path(cat))
    assert load_ils_results(cat).empty  # the recorded hash of town is the old one
    run = run_ils_baseline(cat, regions=["town"], tourists="benchmark", workers=1,
                           progress=False)
    assert run.computed == 1
    region = open_catalog(cat).region("town")
    got = get_demos(open_catalog(cat), ["town"], 4, seed=1)["town"]
    assert got.tourists.scores.shape == (4, region.n_nodes)
    stored = pd.read_parquet(demos_path(cat))
    assert len(stored) == 4 and stored["region_sha256"].nunique() == 1


def test_baseline_clear_removes_only_the_stores_rows_asked_for(cat, capsys):
    """`optw baseline clear --store demos --regions R` drops R's rows only; `--store ils`
    removes the ILS stores whole; an unreadable store can only be cleared whole; no other file
    of baselines/ is touched."""
    get_demos(open_catalog(cat), ["r199", "pr99"], 3, seed=1)
    run_ils_baseline(cat, regions=["r199"], tourists="benchmark", workers=1, progress=False)
    mine = cat / "baselines" / "notes.parquet"
    mine.write_bytes(b"the user's own file")
    base = ["baseline", "clear", "--catalog", str(cat)]
    assert main([*base, "--store", "demos", "--regions", "r199"]) == 0
    assert "removed 3 row(s) of r199" in capsys.readouterr().out
    assert set(pd.read_parquet(demos_path(cat))["region"]) == {"pr99"}
    assert main([*base, "--store", "ils"]) == 0
    assert not ils_store_path(cat).exists() and demos_path(cat).exists()
    _truncate(demos_path(cat))
    assert main([*base, "--store", "demos", "--regions", "pr99"]) == 2
    assert f"optw baseline clear --store demos --catalog {cat}" in capsys.readouterr().err
    assert main(base) == 0
    assert sorted(p.name for p in (cat / "baselines").iterdir()) == ["notes.parquet"]
    assert mine.read_bytes() == b"the user's own file"


def test_catalog_remove_refuses_an_unreadable_store_and_changes_nothing(cat):
    """`optw catalog remove` with an unreadable store under baselines/ is one line naming it
    and the clear command, and the catalog is unchanged."""
    add_region("town", FIX / "town.csv", catalog=cat)
    get_demos(open_catalog(cat), ["town"], 2, seed=1)
    _truncate(demos_path(cat))
    manifest = json.loads((cat / "manifest.json").read_text())
    assert main(["catalog", "remove", "town", "--catalog", str(cat)]) == 2
    assert json.loads((cat / "manifest.json").read_text()) == manifest
    assert "town" in open_catalog(cat)
