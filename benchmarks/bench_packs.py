"""Packs against one region after another: summed region-epochs/s of the same training work.

Trains N regions (default: 8 Solomon regions) with the paper recipe (B = 32 sampled routes of
one generated tourist per epoch, lr 1e-4) for E epochs each, twice in this one process:

- ``sequential``: ``optw.train.train`` of each region, one after another;
- ``batched``: ``optw.train.pack.train_pack`` of all of them side by side (weights stacked per
  region, one batched rollout, backward and Adam step per epoch), in packs of ``--pack-size``.

Both train the same models from the same seeds and sample the same routes (the pack is exact
up to rounding; ``tests/test_pack.py``), so they do the same work along the same learning
curves. Validation time is excluded from both. Needs only torch, numpy and pyarrow::

    .venv/bin/python benchmarks/bench_packs.py                      # CPU, 2 threads
    PYTHONPATH=platform python benchmarks/bench_packs.py --device cuda \\
        --regions solomon --pack-size 56 --skip-sequential           # a GPU: all 56 Solomon

Prints a table (and writes ``bench_packs.json`` with ``--out``): wall seconds, summed
region-epochs/s, the ratio batched / sequential, and the device's peak memory on a GPU.
It runs the ``platform/`` beside it (first on ``sys.path``): to measure another commit, run
that commit's own copy from a ``git archive`` of it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchutil import sync

ROOT = Path(__file__).resolve().parents[1]
#: a mix of the six Solomon classes (clustered/random/both, short/long days)
DEFAULT_REGIONS = ["c101", "c201", "r101", "r201", "rc101", "rc201", "c102", "r102"]


def _configs(regions: list[str], epochs: int, device: str, threads: int | None, batch: int):
    from optw.train import TrainConfig

    return [TrainConfig(regions=[r], epochs=epochs, batch_size=batch, val_every=0,
                        val_tourists=1, checkpoint_every=0, seed=100 + i, device=device,
                        threads=threads) for i, r in enumerate(regions)]


def measure_packs(catalog, regions: list[str], epochs: int, device: str = "cpu",
                  threads: int | None = 2, pack_size: int | None = None, batch: int = 32,
                  sequential: bool = True) -> dict[str, Any]:
    """Time both ways of training ``regions`` for ``epochs`` each; see the module docstring."""
    from optw.train import train
    from optw.train.pack import train_pack

    dev = torch.device(device)
    configs = _configs(regions, epochs, device, threads, batch)
    size = pack_size or len(regions)
    warm = _configs(regions[:2], 2, device, threads, batch)
    for c in warm:  # kernels, caches, lazy imports
        train(c, catalog)
    train_pack(warm, catalog)
    out: dict[str, Any] = {"regions": regions, "epochs": epochs, "batch_size": batch,
                           "device": str(dev), "threads": torch.get_num_threads(),
                           "pack_size": size}
    if dev.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(dev)
    if sequential:
        sync(dev)
        t0 = time.perf_counter()
        val = sum(train(c, catalog).last_validation["val_seconds"] for c in configs)
        sync(dev)
        seconds = time.perf_counter() - t0 - val
        out["sequential"] = {"seconds": seconds,
                             "region_epochs_per_s": len(regions) * epochs / seconds}
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    sync(dev)
    t0 = time.perf_counter()
    val = 0.0
    for start in range(0, len(configs), size):
        results = train_pack(configs[start:start + size], catalog)
        val += sum(r.last_validation["val_seconds"] for r in results)
    sync(dev)
    seconds = time.perf_counter() - t0 - val
    out["batched"] = {"seconds": seconds, "region_epochs_per_s": len(regions) * epochs / seconds}
    if dev.type == "cuda":
        out["batched"]["peak_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
    if sequential:
        out["ratio"] = out["batched"]["region_epochs_per_s"] / out["sequential"][
            "region_epochs_per_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--regions", default=",".join(DEFAULT_REGIONS),
                   help="comma-separated region ids, or a group name (solomon, cordeau, gavalas)")
    p.add_argument("--epochs", type=int, default=30, help="epochs per region")
    p.add_argument("--batch", type=int, default=32, help="sampled routes per tourist (B)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (CPU)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--pack-size", type=int, default=None, help="regions per pack (all)")
    p.add_argument("--skip-sequential", action="store_true",
                   help="time the packs only (e.g. 56 regions on a GPU)")
    p.add_argument("--catalog", type=Path, default=None, help="built catalog folder")
    p.add_argument("--out", type=Path, default=None, help="folder for bench_packs.json")
    args = p.parse_args(argv)

    sys.path.insert(0, str(ROOT / "platform"))
    from optw.catalog import GROUPS, open_catalog

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("CUDA is not available here", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    catalog = open_catalog(args.catalog or ROOT / "region_catalog")
    if args.regions in GROUPS:
        regions = catalog.list_regions(args.regions)
    else:
        regions = [r.strip() for r in args.regions.split(",") if r.strip()]
    res = measure_packs(catalog, regions, args.epochs, args.device, args.threads,
                        args.pack_size, args.batch, not args.skip_sequential)
    print(f"{len(regions)} regions × {args.epochs} epochs, B = {args.batch}, {res['device']}"
          f" ({res.get('gpu', str(res['threads']) + ' threads')}), packs of {res['pack_size']}")
    print(f"{'mode':<11} {'wall s':>8} {'region-epochs/s':>16}")
    for mode in ("sequential", "batched"):
        if mode in res:
            r = res[mode]
            peak = f"   peak {r['peak_mb']:.0f} MB" if "peak_mb" in r else ""
            print(f"{mode:<11} {r['seconds']:>8.1f} {r['region_epochs_per_s']:>16.2f}{peak}")
    if "ratio" in res:
        print(f"batched / sequential: {res['ratio']:.2f}x")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_packs.json").write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
