"""ray_cluster.yaml checked offline with Ray's own cluster-launcher code (no cloud calls):
``prepare_config`` merges the provider defaults like ``ray up`` does, ``validate_config``
checks the result against Ray's JSON schema and its cross-field rules."""

from __future__ import annotations

import copy
import os
import re
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


def _exports(command: str) -> dict[str, str]:
    """``NAME=value`` pairs of the ``export`` that starts a start command."""
    head = command.split(";", 1)[0]
    assert head.startswith("export "), command
    return dict(re.findall(r"(\w+)=((?:\$\([^)]*\)|[^\s;])+)", head))


def test_file_mounts_ship_project_and_built_catalog(raw):
    """The project and the built (git-ignored) catalog are mounted (paths relative to the root);
    local environments and run outputs are not uploaded; the head publishes the mounted catalog
    at the OPTW_CATALOG every node reads."""
    mounts = raw["file_mounts"]
    sources = {Path(src) for src in mounts.values()}
    assert Path(".") in sources and Path("region_catalog") in sources
    assert (PROJECT_ROOT / "region_catalog").resolve() == default_catalog_dir().resolve() \
        or "OPTW_CATALOG" in os.environ  # the mount is the catalog the project builds
    catalog_target = next(t for t, s in mounts.items() if Path(s) == Path("region_catalog"))
    catalog = _exports(next(c for c in raw["head_start_ray_commands"] if "ray start" in c))[
        "OPTW_CATALOG"]
    upload = " ".join(raw["head_setup_commands"])
    assert "optw.distributed.mirror upload-catalog" in upload
    assert f"{catalog_target} {catalog}" in upload
    for excluded in (".venv", "mlflow.db", "mlartifacts", "runs"):
        assert excluded in raw["rsync_exclude"]


def test_every_node_gets_the_same_shared_storage_and_tracking_server(raw):
    """Head and workers start Ray with the same OPTW_STORAGE and OPTW_CATALOG, both S3 URIs
    (never a node's own disk), MLFLOW_TRACKING_URI pointing at the head's server on port 5000,
    which serves (proxies) artifacts; workers get the instance profile that lets them reach S3.
    The job's own cluster checks accept these settings."""
    from optw.distributed import storage
    from optw.tracking.uri import check_cluster_tracking

    head = _exports(next(c for c in raw["head_start_ray_commands"] if "ray start" in c))
    worker = _exports(next(c for c in raw["worker_start_ray_commands"] if "ray start" in c))
    for key in ("OPTW_STORAGE", "OPTW_CATALOG"):
        assert head[key] == worker[key] and head[key].startswith("s3://")
        assert storage.is_uri(head[key])
    assert head["OPTW_CATALOG"].startswith(head["OPTW_STORAGE"] + "/")
    assert head["MLFLOW_TRACKING_URI"].startswith("http://")
    assert worker["MLFLOW_TRACKING_URI"] == "http://$RAY_HEAD_IP:5000"
    check_cluster_tracking(worker["MLFLOW_TRACKING_URI"], 2)
    server = next(c for c in raw["head_start_ray_commands"] if "optw.tracking.server" in c)
    assert "--port 5000" in server and "--no-serve-artifacts" not in server
    bucket = head["OPTW_STORAGE"].split("/")[2]
    assert bucket in " ".join(raw["head_setup_commands"])
    for name, node in raw["available_node_types"].items():
        if name != raw["head_node_type"]:
            assert node["node_config"]["IamInstanceProfile"]["Arn"].startswith("arn:aws:iam::")


def test_no_credentials_in_config():
    """The file holds no cloud credentials (ray up uses the caller's AWS profile)."""
    text = CONFIG.read_text().lower()
    for word in ("aws_access_key", "aws_secret", "secret_access_key", "password", "token"):
        assert word not in text
