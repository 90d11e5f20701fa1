"""Fast CPU building blocks: linear layers through the faster of MKL and oneDNN, and
memory-lean training blocks.

:func:`linear` sends 2-D float32 CPU inputs of at least :data:`MIN_ROWS` rows to oneDNN (which
fuses the activation or a residual addition), with a hand-written backward, else ``F.linear``.
Inference uses oneDNN wherever present, training only on AVX-512 processors
(``docs/measurements.md``); a machine always takes the same kernels, so resumed runs stay exact.
oneDNN compiles one kernel per input shape: callers keep the distinct row counts few.

:func:`layer_norm`, :func:`feed_forward`, :func:`pointer_logits` and :func:`embed` compute the
plain compositions' values but keep fewer tensors for the backward, which inside
:func:`deferred_grads` sums each weight's gradient in place over its uses.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

_ACTS = ("none", "relu", "tanh")
#: Below this many rows MKL is as fast and the shapes are not worth compiling.
MIN_ROWS = 64


@functools.cache
def onednn() -> bool:
    """Whether the oneDNN op is present and agrees with ``F.linear`` (probed on first use)."""
    op = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if op is None or not torch.backends.mkldnn.is_available():
        return False
    try:
        g = torch.Generator().manual_seed(0)
        x, w = torch.randn(5, 7, generator=g), torch.randn(3, 7, generator=g)
        b, o = torch.randn(3, generator=g), torch.randn(5, 3, generator=g)
        ref = F.linear(x, w, b)
        ok = torch.allclose(op(x, w, b, "relu", [], ""), torch.relu(ref), atol=1e-5)
        ok &= torch.allclose(op.binary(x, o, w, b, "add"), ref + o, atol=1e-5)
        return bool(ok)
    except Exception:  # noqa: BLE001 - any failure means: not usable here
        return False


@functools.cache
def train_onednn() -> bool:
    """Whether training's products go to oneDNN (AVX-512 processors only)."""
    return onednn() and torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def _mm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, act: str,
        other: torch.Tensor | None, dnn: bool) -> torch.Tensor:
    """``act(x·wᵀ + b + other)`` through oneDNN (``dnn``) or MKL."""
    if dnn and other is None:
        return torch.ops.mkldnn._linear_pointwise(x, w, b, act, [], "")
    if dnn:
        y = torch.ops.mkldnn._linear_pointwise.binary(x, other, w, b, "add")
    else:
        y = F.linear(x, w, b)
        if other is not None:
            y.add_(other)
    return y if act == "none" else (y.relu_() if act == "relu" else y.tanh_())


def _cached(cache: dict, w: torch.Tensor, make: Callable, size: int) -> Any:
    """``make(w)``, cached per tensor until its version or storage changes."""
    key = (w._version, w.data_ptr())
    entry = cache.get(id(w))
    if entry is not None and entry[0]() is w and entry[1] == key:
        return entry[2]
    value = make(w)
    if len(cache) > size:  # the others are of weights long gone
        cache.clear()
    cache[id(w)] = (weakref.ref(w), key, value)
    return value


_WT: dict = {}


def _transposed(w: torch.Tensor) -> torch.Tensor:
    """``w.t().contiguous()``, cached (a backward through T steps uses each weight T times)."""
    return _cached(_WT, w, lambda w: w.detach().t().contiguous(), 256)


def _grad_needed(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


class WeightGrads:
    """Weight gradients of a backward summed in place (:func:`deferred_grads`): each use adds
    ``gᵀ·x`` with one ``addmm_`` (not a product and an addition); :meth:`flush` fills ``.grad``."""

    def __init__(self) -> None:
        self._sums: dict[tuple[int, int], list] = {}

    def add(self, w: torch.Tensor, b: torch.Tensor | None, g: torch.Tensor,
            x: torch.Tensor) -> None:
        """``w.grad += gᵀ·x`` (and ``b.grad += g.sum(0)``) at the flush."""
        key = (id(w), id(b))
        entry = self._sums.get(key)
        if entry is None:
            self._sums[key] = [w, b, _weight_grad(g, x), None if b is None else g.sum(0)]
            return
        _weight_grad(g, x, into=entry[2])
        if b is not None:
            entry[3].add_(g.sum(0))

    def __len__(self) -> int:
        """How many weights have a sum."""
        return len(self._sums)

    def flush(self) -> None:
        """Add every weight's sum to its ``.grad``."""
        for w, b, gw, gb in self._sums.values():
            for p, g in ((w, gw), (b, gb)):
                if p is not None and p.grad is None:
                    p.grad = g.contiguous()
                elif p is not None:
                    p.grad.add_(g)
        self._sums.clear()


def _weight_grad(g: torch.Tensor, x: torch.Tensor,
                 into: torch.Tensor | None = None) -> torch.Tensor:
    """``gᵀ·x``, or added in place to ``into`` (an earlier result of this function); for few
    input features (the embedding's 8) as ``(xᵀ·g)ᵀ``, which MKL runs several times faster."""
    few = x.shape[1] < 16
    if into is None:
        return torch.mm(x.t(), g).t() if few else torch.mm(g.t(), x)
    if few:
        into.t().addmm_(x.t(), g)
    else:
        into.addmm_(g.t(), x)
    return into


_DEFERRED: WeightGrads | None = None


@contextmanager
def deferred_grads() -> Iterator[WeightGrads]:
    """Within this block, backward passes of the blocks below sum leaf weights' gradients in
    place (:class:`WeightGrads`), moved into ``.grad`` when it ends. Not thread-safe."""
    global _DEFERRED
    outer, stash = _DEFERRED, WeightGrads()
    _DEFERRED = stash
    try:
        yield stash
    finally:
        _DEFERRED = outer
        stash.flush()


def _defer(w: torch.Tensor, b: torch.Tensor | None, g: torch.Tensor, x: torch.Tensor,
           need_w: bool, need_b: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(gᵀ·x, g.sum(0))`` for the weights that need them, or ``(None, None)`` when a
    :func:`deferred_grads` block takes them over (both leaves, both needing gradients)."""
    stash = _DEFERRED
    if (stash is not None and need_w and w.is_leaf and (b is None or (need_b and b.is_leaf))):
        stash.add(w, b, g, x)
        return None, None
    return (_weight_grad(g, x) if need_w else None), (g.sum(0) if need_b else None)


#: Whether ``torch.compile`` is tracing (compiled code takes the plain compositions).
tracing = torch.compiler.is_compiling


def fast_rows(x: torch.Tensor) -> bool:
    """Whether ``x`` takes the fast path (2-D float32 CPU, at least :data:`MIN_ROWS` rows)."""
    return (onednn() and not tracing() and x.dim() == 2 and x.shape[0] >= MIN_ROWS
            and x.dtype == torch.float32 and x.device.type == "cpu")


def raw_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x·wᵀ + b`` as training computes it, without autograd (where :func:`fast_rows`)."""
    return _mm(x.contiguous(), w, b, "none", None, train_onednn())


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, act, other):
        y = _mm(x, w, b, act, other, train_onednn())
        ctx.act = act
        ctx.has_other = other is not None
        ctx.save_for_backward(x, w, b, y if act != "none" else None)
        return y

    @staticmethod
    def backward(ctx, g):
        x, w, b, y = ctx.saved_tensors
        if ctx.act == "relu":
            g = g.masked_fill(y <= 0, 0.0)
        elif ctx.act == "tanh":
            g = g * (1.0 - y * y)
        g = g.contiguous()
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        gx = _mm(g, _transposed(w), None, "none", None, train_onednn()) if need_x else None
        gw, gb = _defer(w, b, g, x, need_w, need_b)
        return gx, gw, gb, None, (g if ctx.has_other else None)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           act: str = "none", add: torch.Tensor | None = None) -> torch.Tensor:
    """``act(x·Wᵀ + b + add)`` for ``x[N, in]`` (``act``: none, relu, tanh)."""
    if act not in _ACTS:
        raise ValueError(f"unknown activation {act!r}; expected one of {_ACTS}")
    if fast_rows(x) and weight.dtype == torch.float32 and (
            add is None or add.shape == (x.shape[0], weight.shape[0])):
        x = x.contiguous()
        add = add.contiguous() if add is not None else None
        if _grad_needed(x, weight, bias, add):
            return _Linear.apply(x, weight, bias, act, add)
        return _mm(x, weight, bias, act, add, onednn())
    y = F.linear(x, weight, bias)
    if add is not None:
        y = y + add
    return y if act == "none" else (torch.relu(y) if act == "relu" else torch.tanh(y))


class _LayerNormFromOutput(torch.autograd.Function):
    """Layer norm whose backward recovers the normalised input from its OUTPUT
    (``(y - b) / w``), which the next block keeps anyway, instead of keeping the input too."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, _, rstd = torch.native_layer_norm(x, (x.shape[-1],), weight, bias, eps)
        ctx.save_for_backward(y, weight, bias, rstd)
        return y

    @staticmethod
    def backward(ctx, g):
        y, w, b, rstd = ctx.saved_tensors
        centred = (y - b) / w / rstd  # x - mean
        zero = torch.zeros_like(rstd)
        gx, gw, gb = torch.ops.aten.native_layer_norm_backward(
            g.contiguous(), centred, (y.shape[-1],), zero, rstd, w, b, [True, True, True])
        return gx, gw, gb, None


#: The output-based layer-norm backward is used while every |weight| is at least this.
LN_MIN_WEIGHT = 0.05
_LN_OK: dict = {}


def ln_weight_ok(weight: torch.Tensor) -> bool:
    """``min |weight| >= LN_MIN_WEIGHT``, cached."""
    return _cached(_LN_OK, weight, lambda w: bool(w.detach().abs().min() >= LN_MIN_WEIGHT), 4096)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               eps: float = 1e-5) -> torch.Tensor:
    """``F.layer_norm`` over the last dimension of ``x[N, d]``; on the CPU with gradients the
    backward works from the output unless some weight is near 0 (GPUs keep PyTorch's: the
    check would synchronise with the host)."""
    if (_grad_needed(x, weight, bias) and x.dim() == 2 and x.device.type == "cpu"
            and not tracing() and ln_weight_ok(weight)):
        return _LayerNormFromOutput.apply(x, weight, bias, eps)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


#: Hidden activations of at most this many elements are kept for the backward; larger ones
#: are recomputed there (the same kernel on the same inputs: the same values).
KEEP_HIDDEN = 1 << 19


class _FeedForward(torch.autograd.Function):
    """``y + W2 relu(W1 y + b1) + b2`` keeping ``y`` (and the hidden layer when small)."""

    @staticmethod
    def forward(ctx, y, w1, b1, w2, b2):
        f = _mm(y, w1, b1, "relu", None, train_onednn())
        ctx.keep = f.numel() <= KEEP_HIDDEN
        ctx.save_for_backward(y, w1, b1, w2, b2, f if ctx.keep else None)
        return _mm(f, w2, b2, "none", y, train_onednn())

    @staticmethod
    def backward(ctx, g):
        y, w1, b1, w2, b2, f = ctx.saved_tensors
        g = g.contiguous()
        if f is None:
            f = _mm(y, w1, b1, "relu", None, train_onednn())
        need = ctx.needs_input_grad
        gw2, gb2 = _defer(w2, b2, g, f, need[3], need[4])
        gf = _mm(g, _transposed(w2), None, "none", None, train_onednn()).masked_fill_(f <= 0, 0.0)
        del f
        gw1, gb1 = _defer(w1, b1, gf, y, need[1], need[2])
        gy = _mm(gf, _transposed(w1), None, "none", g, train_onednn())
        return gy, gw1, gb1, gw2, gb2


def feed_forward(y: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                 b2: torch.Tensor) -> torch.Tensor:
    """The residual feed-forward block ``y + W2 relu(W1 y + b1) + b2``."""
    if fast_rows(y) and _grad_needed(y, w1, b1, w2, b2):
        return _FeedForward.apply(y.contiguous(), w1, b1, w2, b2)
    return linear(linear(y, w1, b1, act="relu"), w2, b2, add=y)


class _Pointer(torch.autograd.Function):
    """Pointer logits keeping the node encodings (and ``u`` when small, :data:`KEEP_HIDDEN`)."""

    @staticmethod
    def forward(ctx, enc, w_ref, query, route, v, clip):
        u = _mm(enc, w_ref, None, "tanh", query.index_select(0, route), train_onednn())
        t = torch.tanh(torch.mv(u, v))
        ctx.clip = clip
        keep = u.numel() <= KEEP_HIDDEN
        ctx.save_for_backward(enc, w_ref, query, route, v, t, u if keep else None)
        return clip * t

    @staticmethod
    def backward(ctx, g):
        enc, w_ref, query, route, v, t, u = ctx.saved_tensors
        if u is None:
            u = _mm(enc, w_ref, None, "tanh", query.index_select(0, route), train_onednn())
        gs = g * ctx.clip * (1.0 - t * t)
        gv = torch.mv(u.t(), gs)
        gpre = torch.outer(gs, v).mul_(1.0 - u * u)
        del u
        g_enc = _mm(gpre, _transposed(w_ref), None, "none", None, train_onednn())
        g_w = _defer(w_ref, None, gpre, enc, ctx.needs_input_grad[1], False)[0]
        g_query = torch.zeros_like(query).index_add_(0, route, gpre)
        return g_enc, g_w, g_query, None, gv, None


def pointer_logits(enc: torch.Tensor, w_ref: torch.Tensor, query: torch.Tensor,
                   route: torch.Tensor, v: torch.Tensor, clip: float) -> torch.Tensor:
    """``clip·tanh(v · tanh(W_ref enc_i + query[route_i]))`` for rows ``enc[N, d]``."""
    if fast_rows(enc) and _grad_needed(enc, w_ref, query, v):
        return _Pointer.apply(enc.contiguous(), w_ref, query, route, v, clip)
    u = linear(enc, w_ref, act="tanh", add=query.index_select(0, route))
    return clip * torch.tanh(torch.mv(u, v))


class _Embed(torch.autograd.Function):
    """``[static, tanh(W dyn + b)]`` keeping the result only (the tanh output is part of it)."""

    @staticmethod
    def forward(ctx, static, dyn, w, b):
        h = (_mm(dyn.contiguous(), w, b, "tanh", None, train_onednn()) if fast_rows(dyn)
             else torch.tanh(F.linear(dyn, w, b)))  # as training computes products
        x = torch.cat([static, h], dim=1)
        ctx.split = static.shape[1]
        ctx.save_for_backward(dyn, x, w, b)
        return x

    @staticmethod
    def backward(ctx, g):
        dyn, x, w, b = ctx.saved_tensors
        k = ctx.split
        t = x[:, k:]
        gpre = g[:, k:] * (1.0 - t * t)
        gw, gb = _defer(w, b, gpre, dyn, *ctx.needs_input_grad[2:4])
        return g[:, :k], None, gw, gb


def embed(static: torch.Tensor, dyn: torch.Tensor, w: torch.Tensor,
          b: torch.Tensor) -> torch.Tensor:
    """Node inputs ``[static, tanh(W dyn + b)]`` (``dyn`` is data: no gradient to it)."""
    if (_grad_needed(static, w, b) and static.dim() == 2 and not dyn.requires_grad
            and not tracing()):
        return _Embed.apply(static, dyn, w, b)
    return torch.cat([static, linear(dyn, w, b, act="tanh")], dim=1)
