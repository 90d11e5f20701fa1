"""The platform job starting from a released global model (a real local Ray, a real MLflow
store, tiny regions)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import TINY_PRETRAIN_PROFILE, copy_catalog, local_ray
from optw.catalog import Catalog
from optw.distributed import JobProfile


@pytest.fixture(scope="module")
def released(tiny_catalog, tmp_path_factory):
    """A private tiny catalog, a gavalas release made from it in a folder of its own
    (``$OPTW_RELEASES``, which the Ray workers inherit), and a local Ray."""
    from optw.distributed.pretrain import make_release, pretrain

    root = tmp_path_factory.mktemp("released")
    catalog = Catalog(copy_catalog(tiny_catalog, root / "catalog"))
    (root / "pretrain.toml").write_text(TINY_PRETRAIN_PROFILE)
    (root / "releases").mkdir()
    pretrain("gavalas", 1.0, root / "state", root / "pretrain.toml", catalog.path, epochs=2)
    card = make_release("gavalas", root / "state", None, root / "pretrain.toml", catalog.path,
                        root / "releases", "")
    before = os.environ.get("OPTW_RELEASES")
    os.environ["OPTW_RELEASES"] = str(root / "releases")
    try:
        with local_ray():
            yield catalog, card, root
    finally:
        if before is None:
            os.environ.pop("OPTW_RELEASES")
        else:
            os.environ["OPTW_RELEASES"] = before


def test_a_job_fine_tunes_from_a_release_and_names_it(released, tmp_path):
    """global-ft with ``releases = true``: t199 is fine-tuned from the gavalas release (no
    global model of gavalas is trained), r199 from a global model the job trains; the summary,
    the fine-tune's MLflow run and its registered version name the release, and only the
    fine-tune from the release takes ``[finetune.release]``'s lr."""
    from optw.distributed.cli import format_summary
    from optw.distributed.job import run_job
    from optw.tracking import get_client

    catalog, card, _ = released
    profile = JobProfile.from_dict({
        "job": {"name": "from-release", "mode": "global-ft", "releases": True,
                "regions": ["r199", "t199"]},
        "train": {"epochs": 2, "batch_size": 4, "val_every": 0, "val_tourists": 4,
                  "checkpoint_every": 0, "threads": 1},
        "finetune": {"epochs": 1, "finetune_lr": 1e-4, "release": {"finetune_lr": 2e-5}},
        "evaluate": {"beams": 2, "validation_tourists": 4, "beam_sweep": [1]},
        "resources": {"cpus_per_region": 1}}, source="test-release")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    summary = run_job(profile, catalog_dir=catalog.path, tracking_uri=uri,
                      storage=tmp_path / "ray_train", out_dir=tmp_path / "out", progress=False)
    label = f"gavalas v1 (sha256 {card['sha256'][:12]})"
    assert summary.releases == {"gavalas": label}
    assert sorted(summary.trained) == ["global-solomon", "r199", "t199"]
    assert label in format_summary(summary)
    client = get_client(uri)
    mv = client.get_model_version_by_alias("optw-t199", "champion")
    assert mv.tags["release"] == label
    run = client.get_run(mv.run_id)
    assert run.data.params["init_from"] == "release:gavalas"
    assert float(run.data.params["train.finetune_lr"]) == 2e-5
    other = client.get_model_version_by_alias("optw-r199", "champion")
    assert "release" not in other.tags
    assert float(client.get_run(other.run_id).data.params["train.finetune_lr"]) == 1e-4
    assert Path(summary.results_path).exists()
