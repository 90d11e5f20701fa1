"""The decoder's attention on the CPU: PyTorch's fused kernel against three batched products.

For tables of R routes × m rows (8 heads of 16, a random graph bias), times forward and
backward (training) and forward alone (inference) with each, in one process, and says which
one :func:`optw.model.network.attention` picks (:func:`optw.model.network._products_win`)::

    PYTHONPATH=platform .venv/bin/python benchmarks/bench_attention.py              # 2 threads
    PYTHONPATH=platform .venv/bin/python benchmarks/bench_attention.py --threads 1

Ratios are fused time / products time (> 1: the products are faster).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F


def products(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
             scale: float) -> torch.Tensor:
    """What :func:`optw.model.network.attention` computes when the products win."""
    return torch.matmul(torch.matmul(q, k.transpose(-1, -2)).mul_(scale).add_(bias)
                        .softmax(-1), v)


def best_ms(f: Callable[[], object], repeats: int) -> float:
    """Mean milliseconds per call over ``repeats`` calls after two warm-up calls."""
    for _ in range(2):
        f()
    t0 = time.perf_counter()
    for _ in range(repeats):
        f()
    return (time.perf_counter() - t0) / repeats * 1e3


def main(argv: list[str] | None = None) -> int:
    from optw.model.network import _products_win

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--routes", default="1,4,16,64", help="table counts R, comma-separated")
    p.add_argument("--widths", default="16,32,48,64,96,128", help="rows m, comma-separated")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"bench_attention: {args.threads} threads, torch {torch.__version__}")
    print(f"{'R':>4} {'m':>4} | {'train fused':>11} {'products':>9} {'x':>5} | "
          f"{'infer fused':>11} {'products':>9} {'x':>5} | picks (train, infer)")
    for r in (int(x) for x in args.routes.split(",")):
        for m in (int(x) for x in args.widths.split(",")):
            q, k, v = (torch.randn(r, 8, m, 16, requires_grad=True) for _ in range(3))
            bias = torch.where(torch.rand(r, 1, m, m) < 0.7, 0.0, -1e32)
            grad = torch.randn(r, 8, m, 16)

            fused = partial(F.scaled_dot_product_attention, q, k, v, attn_mask=bias, scale=0.25)
            prod = partial(products, q, k, v, bias, 0.25)
            train = [best_ms(lambda f=f, g=grad: f().backward(g), args.repeats)
                     for f in (fused, prod)]
            with torch.no_grad():
                infer = [best_ms(f, args.repeats) for f in (fused, prod)]
            picks = ["products" if _products_win(r, m, g) else "fused" for g in (True, False)]
            print(f"{r:4d} {m:4d} | {train[0]:11.2f} {train[1]:9.2f} {train[0] / train[1]:5.2f} | "
                  f"{infer[0]:11.2f} {infer[1]:9.2f} {infer[0] / infer[1]:5.2f} | "
                  f"{', '.join(picks)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
