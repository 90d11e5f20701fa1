"""Settings a Ray cluster cannot run are refused before any worker starts (a real local Ray,
tiny regions)."""

from __future__ import annotations

import pytest

from conftest import local_ray
from optw.distributed import JobProfile
from optw.errors import ConfigError


@pytest.fixture(scope="module")
def ray_cluster():
    with local_ray() as ray:
        yield ray


def _profile(table: str, **settings) -> JobProfile:
    data = {"job": {"name": "preflight", "mode": "global-ft", "regions": ["r199"]},
            "train": {"epochs": 2, "batch_size": 4, "val_every": 0, "val_tourists": 4,
                      "threads": 1},
            "evaluate": {"beams": 2, "validation_tourists": 4, "beam_sweep": [1]}}
    data.setdefault(table, {}).update(settings)
    return JobProfile.from_dict(data, source="p.toml")


@pytest.mark.parametrize("table,key,value", [("train", "rollout", "graph"),
                                             ("finetune", "rollout", "graph"),
                                             ("train", "device", "cuda")])
def test_a_job_the_cluster_cannot_run_is_refused_before_any_worker(
        ray_cluster, tiny_catalog, tmp_path, table, key, value):
    """rollout = 'graph' ([train] or [finetune]) or device = 'cuda' on a cluster without GPUs:
    one ConfigError naming the file, table and key, before any worker, store or folder is
    made."""
    from optw.distributed.job import run_job

    with pytest.raises(ConfigError, match=f"p.toml \\[{table}\\]: {key} = '{value}'") as e:
        run_job(_profile(table, **{key: value}), catalog_dir=tiny_catalog.path,
                tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                storage=tmp_path / "ray_train", out_dir=tmp_path / "out", progress=False)
    assert e.value.key == key
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "out").exists()
    assert not (tmp_path / "ray_train").exists()


def test_a_sweep_the_cluster_cannot_run_is_refused_before_any_trial(ray_cluster, tiny_catalog,
                                                                    tmp_path):
    """optw tune's sweep with rollout = 'graph' on a CPU cluster: the same one-line error,
    before Tune starts a trial (no Tune folder)."""
    from optw.distributed.tune import run_sweep

    with pytest.raises(ConfigError, match=r"p.toml \[train\]: rollout = 'graph'"):
        run_sweep(_profile("train", rollout="graph", val_every=1), ["r199"], num_samples=1,
                  catalog_dir=tiny_catalog.path,
                  tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                  storage=tmp_path / "tune", progress=False)
    assert not (tmp_path / "tune").exists()
