"""The CUDA path: the checks of ``benchmarks/gpu_check.py`` under pytest, on a machine with
CUDA; skipped elsewhere (CI has no GPU). They need only torch, numpy and pyarrow:
``PYTHONPATH=platform python -m pytest -m gpu tests/test_gpu.py`` or, without pytest,
``benchmarks/gpu_check.py`` (docs/gpu.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import gpu_check  # benchmarks/ is on pytest's pythonpath (pyproject.toml)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")]
#: the published weights: $OPTW_PRETRAINED, ../shared beside the project, or what `make
#: device-prep` copied for a device run
PRETRAINED = next((p for p in (Path(os.environ.get("OPTW_PRETRAINED", "/nonexistent")),
                               Path(__file__).resolve().parents[2] / "shared" / "reference"
                               / "pretrained",
                               Path(__file__).resolve().parents[1] / ".device" / "pretrained")
                   if p.is_dir()), Path("/nonexistent"))
needs_weights = pytest.mark.skipif(not (PRETRAINED / gpu_check.WEIGHTS["pr01"]).exists(),
                                   reason="published weights not found")
CUDA = torch.device("cuda")


@needs_weights
def test_published_weights_on_cuda(catalog):
    """Beam 128 (published-outputs mode) on CUDA: pr01 -> 308, t101 -> 399, the CPU's routes."""
    assert gpu_check.check_published(catalog, PRETRAINED, CUDA)["ok"]


@needs_weights
def test_greedy_routes_equal_cpu_on_cuda(catalog):
    """Greedy on CUDA gives the CPU's routes on the 64 validation tourists of pr01 and t101."""
    assert gpu_check.check_greedy(catalog, PRETRAINED, CUDA)["ok"]


@needs_weights
def test_static_rollout_samples_the_compacted_routes_on_cuda(catalog):
    """On CUDA the static-shape training rollout samples the routes the compacted one samples
    from the same generator (pr01, t101, published weights)."""
    res = gpu_check.check_static(catalog, PRETRAINED, CUDA)
    assert res["ok"], res


def test_training_learns_on_cuda(catalog):
    """A short REINFORCE run on CUDA raises pr01's greedy validation score by more than 10%."""
    res = gpu_check.check_learns(catalog, CUDA)
    assert res["ok"], res


def test_pack_trains_on_cuda(catalog):
    """A pack of three per-region models trained side by side on CUDA samples the routes each
    model samples alone there, and ends with weights equal within rounding."""
    res = gpu_check.check_pack(catalog, CUDA)
    assert res["ok"], res


@needs_weights
def test_graph_rollout_replays_what_eager_computes_on_cuda(catalog):
    """Rollout "graph" (opt-in CUDA graphs): a replayed epoch gives the rewards, loss and
    gradients the same steps give eagerly from the same random state, and training from
    scratch with it learns."""
    res = gpu_check.check_graph(catalog, PRETRAINED, CUDA)
    assert res["ok"], res
