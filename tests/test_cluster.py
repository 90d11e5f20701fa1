"""ray_cluster.yaml checked offline with Ray's own cluster-launcher code (no cloud calls):
``prepare_config`` merges the provider defaults like ``ray up`` does, ``validate_config``
checks the result against Ray's JSON schema and its cross-field rules."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

from optw.catalog import PROJECT_ROOT, default_catalog_dir

util = pytest.importorskip("ray.autoscaler._private.util")
jsonschema = pytest.importorskip("jsonschema")

CONFIG = PROJECT_ROOT / "ray_cluster.yaml"


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(CONFIG.read_text())


@pytest.fixture(scope="module")
def prepared(raw) -> dict:
    config = util.prepare_config(copy.deepcopy(raw))
    util.validate_config(config)
    return config


def test_config_passes_ray_validation(prepared):
    """The file is a valid cluster-launcher config for this Ray version (schema + rules such
    as head_node_type being one of available_node_types)."""
    assert prepared["provider"]["type"] == "aws"
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_validation_is_not_vacuous(raw):
    """Ray's validator rejects a broken copy (unknown key, missing head type), so the test
    above really checks something."""
    bad = copy.deepcopy(raw)
    bad["available_node_types"]["gpu_worker"]["gpus_please"] = 1
    with pytest.raises(jsonschema.ValidationError):
        util.validate_config(util.prepare_config(bad))
    bad = copy.deepcopy(raw)
    bad["head_node_type"] = "nope"
    with pytest.raises(ValueError):
        util.validate_config(util.prepare_config(bad))


def test_head_has_no_gpu_and_gpu_workers_autoscale_from_zero(prepared):
    """The head is CPU-only (also told `ray start --num-gpus=0`); every GPU worker type starts
    at 0 nodes and can grow, within the cluster's max_workers."""
    types = prepared["available_node_types"]
    head = types[prepared["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    assert any("--num-gpus=0" in c for c in prepared["head_start_ray_commands"])
    gpu_types = {k: v for k, v in types.items() if v["resources"].get("GPU", 0) >= 1}
    assert gpu_types
    for node_type in gpu_types.values():
        assert node_type["min_workers"] == 0
        assert 0 < node_type["max_workers"] <= prepared["max_workers"]


def test_setup_installs_cuda_torch_then_the_project(raw):
    """Nodes install the CUDA build of torch before `pip install -e .` (which then keeps it)."""
    cmds = raw["setup_commands"]
    torch_i = next(i for i, c in enumerate(cmds) if "torch" in c and "download.pytorch.org" in c)
    proj_i = next(i for i, c in enumerate(cmds) if "pip install" in c and "-e ." in c)
    assert torch_i < proj_i
    assert "/whl/cu" in cmds[torch_i]


def test_file_mounts_ship_project_and_built_catalog(raw):
    """The project and the built (git-ignored) catalog are mounted (paths relative to the root);
    local environments and run outputs are not uploaded; nodes point OPTW_CATALOG at the
    catalog mount and MLFLOW_TRACKING_URI at the head's server."""
    mounts = raw["file_mounts"]
    sources = {Path(src) for src in mounts.values()}
    assert Path(".") in sources and Path("region_catalog") in sources
    assert (PROJECT_ROOT / "region_catalog").resolve() == default_catalog_dir().resolve() \
        or "OPTW_CATALOG" in os.environ  # the mount is the catalog the project builds
    catalog_target = next(t for t, s in mounts.items() if Path(s) == Path("region_catalog"))
    for cmds in (raw["head_start_ray_commands"], raw["worker_start_ray_commands"]):
        start = next(c for c in cmds if "ray start" in c)
        assert "OPTW_CATALOG=" in start and "MLFLOW_TRACKING_URI=" in start
        assert catalog_target.replace("~", "$HOME") in start
    for excluded in (".venv", "mlflow.db", "mlartifacts"):
        assert excluded in raw["rsync_exclude"]


def test_no_credentials_in_config():
    """The file holds no cloud credentials (ray up uses the caller's AWS profile)."""
    text = CONFIG.read_text().lower()
    for word in ("aws_access_key", "aws_secret", "secret_access_key", "password", "token"):
        assert word not in text
