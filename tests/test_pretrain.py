"""Pretraining of the released global models and the releases themselves (tiny regions, and the
releases that ship with the package on the real catalog)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY_PRETRAIN_PROFILE, copy_catalog
from optw.catalog import Catalog


@pytest.fixture()
def tiny(tiny_catalog, tmp_path) -> tuple[Catalog, Path]:
    """A private copy of the tiny catalog (ILS results are stored into it) and a profile."""
    profile = tmp_path / "pretrain.toml"
    profile.write_text(TINY_PRETRAIN_PROFILE)
    return Catalog(copy_catalog(tiny_catalog, tmp_path / "catalog")), profile


def _state(folder: Path) -> dict:
    from optw.model import read_checkpoint

    return read_checkpoint(folder / "last.pt")


def test_an_interrupted_pretraining_resumes_exactly(tiny, tmp_path):
    """Three calls (2, then 3, then 6 epochs in all) end with the weights, optimiser state and
    curve of one uninterrupted 6-epoch run; the CPU time adds up over the calls."""
    from optw.distributed.pretrain import pretrain, read_curve

    catalog, profile = tiny
    once, split = tmp_path / "once", tmp_path / "split"
    pretrain("gavalas", 1.0, once, profile, catalog.path, epochs=6)
    for epochs in (2, 3, 6):
        done = pretrain("gavalas", 1.0, split, profile, catalog.path, epochs=epochs)
    assert done["epoch"] == 6 and done["routes"] == 6 * 8 and done["cpu_s"] > 0
    a, b = _state(once), _state(split)
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    assert a["train"]["optimizer"]["state"].keys() == b["train"]["optimizer"]["state"].keys()
    curve_a, curve_b = read_curve(once / "curve.csv"), read_curve(split / "curve.csv")
    assert [r["epoch"] for r in curve_b] == ["2", "4", "6"]
    for ra, rb in zip(curve_a, curve_b, strict=True):
        assert {k: v for k, v in ra.items() if k != "cpu_hours"} == \
            {k: v for k, v in rb.items() if k != "cpu_hours"}
    assert json.loads((split / "progress.json").read_text())["epoch"] == 6


def test_a_resumed_pretraining_steps_its_lr_down_and_keeps_it(tiny, tmp_path):
    """``lr=`` steps a resumed state's lr (the one setting a pretraining may change besides
    its budget): the change is kept in the state's ``lr_steps`` and the curve's lr column, a
    later call without it keeps the stepped lr, a release's manifest names the steps, an
    ordinary resume still refuses another lr, and a new state started with ``lr=`` records it."""
    from optw.distributed.pretrain import make_release, pretrain, read_curve
    from optw.errors import UserError
    from optw.train import TrainConfig
    from optw.train.loop import check_resume

    catalog, profile = tiny
    out = tmp_path / "s"
    pretrain("gavalas", 1.0, out, profile, catalog.path, epochs=2)
    pretrain("gavalas", 1.0, out, profile, catalog.path, epochs=4, lr=2.5e-4)
    done = pretrain("gavalas", 1.0, out, profile, catalog.path, epochs=6)
    assert done["lr_steps"] == [[0, 5e-4], [2, 2.5e-4]]
    state = _state(out)
    assert state["train"]["config"]["lr"] == 2.5e-4
    assert [(r["epoch"], float(r["lr"])) for r in read_curve(out / "curve.csv")] == \
        [("2", 5e-4), ("4", 2.5e-4), ("6", 2.5e-4)]
    with pytest.raises(UserError, match="lr: 0.00025 there, 0.0005 now"):
        check_resume(state, TrainConfig.from_dict({**state["train"]["config"], "lr": 5e-4}))
    card = make_release("gavalas", out, ["t199"], profile, catalog.path,
                        folder=tmp_path / "releases", tracking_uri="")
    assert card["training"]["lr_steps"] == [[0, 5e-4], [2, 2.5e-4]]
    fresh = pretrain("gavalas", 1.0, tmp_path / "t", profile, catalog.path, epochs=1, lr=1e-4)
    assert fresh["lr_steps"] == [[0, 1e-4]]


def test_pretraining_refuses_another_groups_state(tiny, tmp_path):
    """A state folder of one group cannot be resumed as another's (the regions differ)."""
    from optw.distributed.pretrain import pretrain
    from optw.errors import UserError

    catalog, profile = tiny
    pretrain("gavalas", 1.0, tmp_path / "s", profile, catalog.path, epochs=1)
    with pytest.raises(UserError, match="regions"):
        pretrain("solomon", 1.0, tmp_path / "s", profile, catalog.path, epochs=2)
    with pytest.raises(UserError, match="no such group.*gavalas"):
        pretrain("nowhere", 1.0, tmp_path / "t", profile, catalog.path, epochs=1)


def test_training_tourists_are_never_validation_or_benchmark_tourists(tiny, tmp_path,
                                                                       monkeypatch):
    """Every tourist the pretraining draws (spied on where the loop samples them) differs from
    each of its region's validation tourists and its benchmark tourist."""
    import optw.train.loop as loop
    from optw.distributed.pretrain import pretrain

    catalog, profile = tiny
    drawn = []

    def spy(region, k, rng, kind=None):
        tourists = sample(region, k, rng, kind)
        drawn.append(tourists)
        return tourists

    sample = loop.sample_tourists
    monkeypatch.setattr(loop, "sample_tourists", spy)
    pretrain("gavalas", 1.0, tmp_path / "s", profile, catalog.path, epochs=40)
    assert sum(len(t) for t in drawn) == 40 * 2
    for batch in drawn:
        held_out = [catalog.validation(batch.region_id), catalog.benchmark(batch.region_id)]
        for i in range(len(batch)):
            for other in held_out:
                for j in range(len(other)):
                    same = (np.allclose(batch.start_xy[i], other.start_xy[j])
                            and batch.t_start[i] == other.t_start[j]
                            and batch.t_end[i] == other.t_end[j]
                            and np.allclose(batch.scores[i], other.scores[j]))
                    assert not same, (batch.region_id, i, other.kind, j)


def test_a_release_is_made_loaded_and_checked(tiny, tmp_path):
    """``make_release`` cools the state down, evaluates it and writes weights + manifest and an
    MLflow version with alias ``release``; ``load_release`` refuses an altered file, another
    architecture and a group without a release, each naming what is wrong."""
    from optw.distributed.pretrain import make_release, pretrain
    from optw.model.release import ReleaseError, load_release, release_groups
    from optw.tracking import get_client, release_model_name

    catalog, profile = tiny
    state, folder = tmp_path / "state", tmp_path / "releases"
    folder.mkdir()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    pretrain("gavalas", 1.0, state, profile, catalog.path, epochs=4)
    card = make_release("gavalas", state, None, profile, catalog.path, folder, uri)
    assert release_groups(folder) == ["gavalas"]
    assert card["version"] == 1 and card["training"]["epochs"] == 4
    assert card["training"]["cooldown_epochs"] == 2  # 0.5 × 4, at most 2
    assert set(card["validation"]["regions"]) == {"t199"}
    model, manifest = load_release("gavalas", folder)
    assert manifest == card and not model.training
    mv = get_client(uri).get_model_version_by_alias(release_model_name("gavalas"), "release")
    assert mv.tags["sha256"] == card["sha256"]
    again = make_release("gavalas", state, None, profile, catalog.path, folder, "")
    assert again["version"] == 2 and again["sha256"] == card["sha256"]  # cooled down once

    weights = folder / "gavalas.pt"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(ReleaseError, match="sha256.*altered"):
        load_release("gavalas", folder)
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    other = {**again, "architecture": {**again["architecture"], "n_layers": 3}}
    (folder / "gavalas.json").write_text(json.dumps(other))
    with pytest.raises(ReleaseError, match="another architecture.*n_layers"):
        load_release("gavalas", folder)
    with pytest.raises(ReleaseError, match="no released model for group 'solomon'.*gavalas"):
        load_release("solomon", folder)


def test_release_list_names_each_shipped_release():
    """``optw release list`` prints one line per shipped release with its figures, and with
    ``--by-class`` one more per region class (Solomon's c1 … rc2)."""
    from optw.model.release import release_groups

    out = subprocess.run([sys.executable, "-m", "optw.cli", "release", "list", "--by-class"],
                         capture_output=True, text=True, check=True).stdout
    groups = release_groups()
    if not groups:
        assert "no releases" in out
    for group in groups:
        assert f"{group} v" in out and "against ILS" in out
    if "solomon" in groups:
        assert "  rc2 (8 regions): greedy" in out and "  c1 (9 regions)" in out


@pytest.mark.parametrize("group", ["solomon", "cordeau", "gavalas"])
def test_a_shipped_release_reproduces_its_manifest(group, catalog, tmp_path):
    """The release loads (checksum, architecture) and, on the two smallest regions its manifest
    evaluated, gives the manifest's greedy and beam gaps to ILS on the validation tourists."""
    from optw.distributed.pretrain import gaps_above_ils, ils_means
    from optw.model.release import load_release, release_groups

    if group not in release_groups():
        pytest.skip(f"no release of {group} ships yet")
    model, card = load_release(group)
    v = card["validation"]
    sizes = catalog.regions_table["nodes"]
    regions = sorted(v["regions"], key=lambda r: (int(sizes[r]), r))[:2]
    own = Catalog(copy_catalog(catalog, tmp_path / "catalog"))
    ils = ils_means(own, regions, v["tourists"])
    gaps = gaps_above_ils(model, own, regions, ils, v["tourists"], v["beams"])
    for rid in regions:
        for method in ("greedy", "beam"):
            assert gaps[rid][method] == pytest.approx(v["regions"][rid][method], abs=1e-3), \
                (rid, method)


def test_plan_starts_from_releases_where_they_exist(catalog):
    """global-ft: a group with a release trains no global model, its fine-tunes start from
    ``release:<group>``; the others train theirs. transfer-to from one released group: the
    release is the source model."""
    from optw.distributed.plan import plan

    first, second = plan("global-ft", catalog, ["c101", "t101", "pr01"],
                         releases=["gavalas", "cordeau"])
    assert [u.key for u in first] == ["global-solomon"]
    assert {u.key: u.init_from for u in second} == {
        "c101": "global-solomon", "t101": "release:gavalas", "pr01": "release:cordeau"}
    first, second = plan("transfer-to", catalog, ["t101"], ["gavalas"], releases=["gavalas"])
    assert first == [] and second[0].init_from == "release:gavalas"
    first, _ = plan("transfer-to", catalog, ["t101"], ["gavalas", "solomon"],
                    releases=["gavalas"])
    assert [u.key for u in first] == ["source-solomon-gavalas"]
