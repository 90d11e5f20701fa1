"""What the benchmarks share: the authors' published weight files and a device barrier for
timing. Each benchmark runs as a script from this folder, which is then on ``sys.path``; the
tests import the benchmarks through pytest's ``pythonpath`` (pyproject.toml)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

#: Where the authors' published weights are: ``../shared/reference/pretrained``.
PRETRAINED = Path(__file__).resolve().parents[2] / "shared" / "reference" / "pretrained"
#: The authors' published weights (in :data:`PRETRAINED`), by region.
WEIGHTS = {"pr01": "pr01_uni_samp_500000.pt", "t101": "t101_corr_samp_500000.pt"}
#: What beam 128 gives with them on each region's benchmark tourist (published outputs).
PUBLISHED_SCORES = {"pr01": 308, "t101": 399}


def sync(device: torch.device | str) -> None:
    """Wait for the device's queued work (CUDA) so that a wall-clock time covers it."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def common_options(p: argparse.ArgumentParser) -> None:
    """Options the model benchmarks share (``bench_ops``, ``bench_bounds``): ``--catalog``,
    ``--pretrained``, ``--seed`` and ``--out``."""
    p.add_argument("--catalog", type=Path, default=None, help="built catalog folder")
    p.add_argument("--pretrained", type=Path, default=PRETRAINED,
                   help="folder with the published weights (else a seeded model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")


def parse_list(value: str, allowed: Sequence[str], prog: str, option: str) -> list[str] | None:
    """The comma-separated entries of ``value``, each one of ``allowed``; else None, after one
    error line naming ``option`` (the caller exits with 2)."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in names if v not in allowed]
    if bad or not names:
        what = f"unknown {bad}" if bad else f"empty ({value!r})"
        print(f"{prog}: error: {option}: {what}; expected of {list(allowed)}", file=sys.stderr)
        return None
    return names


def published_or_seeded(regions: Sequence[str], pretrained: Path, seed: int):
    """The published weights of the first of ``regions`` that has a file in ``pretrained``,
    else a model seeded with ``seed``; and a label saying which."""
    from optw.model import ModelConfig, PointerNet, load_model

    for rid in regions:
        path = pretrained / WEIGHTS.get(rid, "")
        if rid in WEIGHTS and path.is_file():
            return load_model(path), f"published {path.name}"
    torch.manual_seed(seed)
    return PointerNet(ModelConfig()), f"seeded init (seed {seed})"
