"""What a pack keeps for its backward, against its members alone: autograd's saved bytes.

One training rollout (K generated tourists x B sampled routes per region, the paper recipe's
K = 1, B = 32) of P regions, once as a pack (:class:`~optw.model.StackedPointerNet`, one
batched rollout) and once per region alone with the same weights, tourists and generators (so
the same routes). Counts the distinct storages autograd keeps for the backward
(``torch.autograd.graph.saved_tensors_hooks``): the activation memory that bounds a pack's
size on a GPU, measurable on any device. On CUDA it also gives the pack's peak memory for
the rollout and its backward. Needs only torch, numpy and pyarrow::

    PYTHONPATH=platform .venv/bin/python benchmarks/bench_pack_memory.py            # 16 Solomon
    PYTHONPATH=platform .venv/bin/python benchmarks/bench_pack_memory.py \\
        --weights runs/optw-quick/models/global-global-solomon.pt                 # trained

To compare with another commit, run the same command with ``PYTHONPATH`` on a ``git archive``
of that commit's ``platform/`` (its catalog: ``--catalog region_catalog``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchutil import sync


def saved_bytes(fn) -> tuple[int, object]:
    """Bytes of the distinct storages autograd keeps for the backward while ``fn`` runs, and
    what ``fn`` returned."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--regions", default="", help="comma-separated (default: the first 16 "
                   "Solomon regions of the catalog)")
    p.add_argument("--weights", type=Path, default=None,
                   help="a model file for every member (default: a model seeded with 0)")
    p.add_argument("--tourists", type=int, default=1, help="tourists per region (K)")
    p.add_argument("--batch", type=int, default=32, help="sampled routes per tourist (B)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--catalog", type=Path, default=None, help="built catalog folder")
    args = p.parse_args(argv)

    from optw.catalog import open_catalog, sample_tourists
    from optw.decode import rollout
    from optw.env import make_instances, stack_instances
    from optw.model import ModelConfig, PointerNet, load_model
    from optw.model.stacked import StackedPointerNet

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    catalog = open_catalog(args.catalog)
    regions = ([r.strip() for r in args.regions.split(",") if r.strip()]
               or catalog.list_regions("solomon")[:16])

    def model() -> PointerNet:
        if args.weights is not None:
            return load_model(args.weights, map_location=device).train()
        torch.manual_seed(args.seed)
        return PointerNet(ModelConfig()).to(device).train()

    models = [model() for _ in regions]
    rng = np.random.default_rng(args.seed)
    parts = [make_instances(catalog.region(r), sample_tourists(
        catalog.region(r), args.tourists, rng, None), device) for r in regions]
    k, b = args.tourists, args.batch

    def generator(i: int) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(args.seed + i)

    alone = 0
    for i, (m, inst) in enumerate(zip(models, parts, strict=True)):
        n, _ = saved_bytes(lambda m=m, inst=inst, i=i: rollout(
            m, inst, torch.arange(k, device=device).repeat_interleave(b),
            generator=generator(i)))
        alone += n
    stacked = StackedPointerNet(models).to(device).train()
    inst = stack_instances(parts)
    ids = torch.arange(len(regions) * k, device=device).repeat_interleave(b)
    member = torch.arange(len(regions), device=device).repeat_interleave(k)

    def pack_rollout():
        return rollout(stacked, inst, ids, generator=[generator(i) for i in range(len(regions))],
                       member=member)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    pack, out = saved_bytes(pack_rollout)
    sync(device)
    t0 = time.perf_counter()
    out.log_prob.sum().backward()
    sync(device)
    backward_s = time.perf_counter() - t0
    peak = (f", peak {torch.cuda.max_memory_allocated(device) / 2**20:.0f} MB"
            if device.type == "cuda" else "")
    print(f"{len(regions)} regions ({regions[0]}..{regions[-1]}), K = {k} x B = {b}, "
          f"{'weights ' + args.weights.name if args.weights else f'seeded model ({args.seed})'}, "
          f"routes up to {out.routes.shape[1]} nodes, {device}")
    print(f"saved for the backward: members alone {alone / 2**20:.0f} MB (summed), pack "
          f"{pack / 2**20:.0f} MB ({pack / alone:.2f}x); pack backward {backward_s:.2f} s{peak}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
