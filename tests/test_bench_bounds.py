"""`benchmarks/bench_bounds.py`: the operators it counts as matrix products and attention, and
their FLOPs, read from real profiler events of this torch build."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import bench_bounds as bb
from optw.model import fastops


def _counted(fn) -> tuple[float, float]:
    """GFLOP the benchmark's rules read off the profiler for ``fn``: products, attention."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    products = sum(bb.product_flops(e.name, e.input_shapes) for e in prof.events()
                   if e.name in bb.PRODUCTS)
    attention = sum(bb.attention_flops(e.name, e.input_shapes) for e in prof.events()
                    if any(a in e.name for a in bb.ATTENTION))
    return products, attention


def test_products_are_recognised_with_their_flops():
    """Every product kind the model runs (MKL's mm/addmm/bmm, in place or not, and oneDNN's
    linear, plain and fused with an addition) is counted with 2·M·K·N FLOPs: a torch upgrade
    that renames an operator or reorders its inputs would otherwise make the bound read 0."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(96, 32, generator=g), torch.randn(48, 32, generator=g)
    b, out = torch.randn(48, generator=g), torch.randn(96, 48, generator=g)
    one = 2.0 * 96 * 32 * 48
    assert _counted(lambda: x @ w.t())[0] == one
    assert _counted(lambda: F.linear(x, w, b))[0] == one
    assert _counted(lambda: out.clone().addmm_(x, w.t()))[0] == one
    assert _counted(lambda: torch.bmm(x.view(3, 32, 32), x.view(3, 32, 32)))[0] == (
        2.0 * 3 * 32 * 32 * 32)
    if fastops.onednn():
        assert _counted(lambda: fastops._mm(x, w, b, "tanh", None, True))[0] == one
        assert _counted(lambda: fastops._mm(x, w, b, "none", out, True))[0] == one


def test_fused_attention_is_recognised_forward_and_backward():
    """PyTorch's fused CPU attention counts 4·B·H·M·N·d forward and 2.5 times that backward."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 40, 16, generator=g, requires_grad=True) for _ in range(3))
    bias = torch.zeros(2, 1, 40, 40)
    fwd = 4.0 * 2 * 4 * 40 * 40 * 16

    def run() -> None:
        F.scaled_dot_product_attention(q, k, v, attn_mask=bias).sum().backward()

    assert _counted(run)[1] == fwd * 3.5
