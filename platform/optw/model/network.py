"""The paper's recursive, graph-masked pointer network (one decoding step at a time), as
docs/model.md ("Architecture") and ``shared/spec/published-checkpoints.md`` describe it.

Per-head projections are fused (queries and values of all heads in one ``d -> 2d`` product, the
keys of all layers in one ``d -> n_layers·d`` product). The network works on packed node rows of
many routes; a :class:`Layout` says which rows form each route's attention table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from optw.model.config import ModelConfig
from optw.model.fastops import (
    _grad_needed,
    feed_forward,
    layer_norm,
    linear,
    pointer_logits,
    tracing,
)
from optw.model.fastops import embed as embed_rows

#: Score given to attention entries outside the graph (the authors' value).
MASKED_SCORE = -1e32


def heads_to_linear(w: torch.Tensor) -> torch.Tensor:
    """Per-head projections ``w[H, d_in, d_k]`` -> a Linear weight ``[H·d_k, d_in]``."""
    h, d_in, d_k = w.shape
    return w.permute(0, 2, 1).reshape(h * d_k, d_in)


def graph_bias(adj: torch.Tensor) -> torch.Tensor:
    """Attention bias [R, 1, m, m] from the bool graph ``adj[R, m, m]``."""
    return torch.where(adj, 0.0, MASKED_SCORE).unsqueeze(1)


@dataclass
class Bucket:
    """Routes whose rows form one padded table ``[n_routes, width]``; ``bias[n_routes, 1, width,
    width]``: 0 where the graph allows attention, else -1e32 (padding is never a column)."""

    n_routes: int
    width: int
    bias: torch.Tensor


@dataclass
class Layout:
    """Where the packed node rows ``[N, ...]`` go for attention, which runs per bucket on a
    padded table: ``gather[T]`` is the packed row of each padded position (padding repeats a row
    of the route, masked as a column), ``back[N]`` each packed row's padded position,
    ``route[N]`` its route."""

    route: torch.Tensor
    gather: torch.Tensor
    back: torch.Tensor
    buckets: list[Bucket]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
              scale: float) -> torch.Tensor:
    """softmax(q·kᵀ·scale + bias)·v over [R, H, m, d_k]: PyTorch's fused kernel, or on the CPU
    batched products where they are faster (:func:`_products_win`)."""
    r, m = q.shape[0], q.shape[2]
    if q.device.type == "cpu" and not tracing() and _products_win(r, m, _grad_needed(q, k, v)):
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).add_(bias)
        return torch.matmul(scores.softmax(-1), v)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


def _products_win(r: int, m: int, grad: bool) -> bool:
    """Whether batched products beat the fused CPU attention (``benchmarks/bench_attention.py``)."""
    if torch.get_num_threads() >= 2:
        return (r >= 4 and 32 <= m <= 64) or (r >= 32 and m <= 16)
    return grad and r >= 16 and m <= 48


def bucket_attention(q_all: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor,
                     layout: Layout, n_heads: int) -> torch.Tensor:
    """Multi-head attention on the padded tables ``[T, d]`` of ``layout``, bucket by bucket."""
    d = q_all.shape[1]
    dk = d // n_heads
    buckets = layout.buckets
    if len(buckets) == 1:
        parts = [(q_all, k_all, v_all)]
    else:  # split, not sliced: the backward is one cat, not a zero-filled copy per slice
        sizes = [b.n_routes * b.width for b in buckets]
        parts = list(zip(q_all.split(sizes), k_all.split(sizes), v_all.split(sizes), strict=True))
    outs = []
    for b, (q, k, v) in zip(buckets, parts, strict=True):
        r, m = b.n_routes, b.width
        q, v, k = (t.view(r, m, n_heads, dk).transpose(1, 2) for t in (q, v, k))
        o = attention(q, k, v, b.bias, 1.0 / math.sqrt(dk))
        outs.append(o.transpose(1, 2).reshape(r * m, d))
    return outs[0] if len(outs) == 1 else torch.cat(outs)


class EncoderLayer(nn.Module):
    """Graph-masked multi-head attention (keys given) + feed-forward, post-norm residuals."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.qv = nn.Linear(d, 2 * d, bias=False)  # queries then values, heads concatenated
        self.k = nn.Linear(d, d, bias=False)
        self.out = nn.Linear(d, d)
        self.norm1 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, cfg.d_ff)
        self.ff2 = nn.Linear(cfg.d_ff, d)
        self.norm2 = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, keys: torch.Tensor, layout: Layout) -> torch.Tensor:
        """``x`` packed rows [N, d]; ``keys`` projected and gathered to the padded table [T, d]."""
        d = x.shape[1]
        q, v = linear(x, self.qv.weight).split(d, dim=1)
        # separate contiguous gathers: the attention kernel then keeps them without copies
        o = bucket_attention(q.index_select(0, layout.gather), keys,
                             v.index_select(0, layout.gather), layout, self.n_heads)  # [T, d]
        # projecting in the padded layout keeps only the kernel's output for the backward
        return self._feed_forward(
            linear(o, self.out.weight, self.out.bias).index_select(0, layout.back) + x)

    def dense(self, x: torch.Tensor, keys: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """The same layer on full route-major tables ``x``, ``keys`` [R·n, d]: no gathers."""
        r, n = bias.shape[0], bias.shape[-1]
        d, h = x.shape[1], self.n_heads
        qv = linear(x, self.qv.weight)
        q, v, k = (t.reshape(r, n, h, d // h).transpose(1, 2) for t in (qv[:, :d], qv[:, d:], keys))
        o = attention(q, k, v, bias, 1.0 / math.sqrt(d // h)).transpose(1, 2).reshape(r * n, d)
        return self._feed_forward(linear(o, self.out.weight, self.out.bias, add=x))

    def _feed_forward(self, z: torch.Tensor) -> torch.Tensor:
        """``LN(y + W2 relu(W1 y))`` of ``y = LN(z)`` (``z``: attention output plus residual)."""
        y = layer_norm(z, self.norm1.weight, self.norm1.bias, self.norm1.eps)
        z = feed_forward(y, self.ff1.weight, self.ff1.bias, self.ff2.weight, self.ff2.bias)
        return layer_norm(z, self.norm2.weight, self.norm2.bias, self.norm2.eps)


class PointerNet(nn.Module):
    """The model (see the module docstring)."""

    def __init__(self, cfg: ModelConfig | None = None):
        super().__init__()
        self.cfg = cfg = cfg or ModelConfig()
        #: the regions it was trained on, where its file says (set by ``load_model``)
        self.trained_on: tuple[str, ...] | None = None
        d = cfg.d_model
        self.static_embed = nn.Linear(cfg.n_static, d // 2)
        self.dynamic_embed = nn.Linear(cfg.n_dynamic, d // 2)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.lstm = nn.LSTMCell(d, d)
        self.h0 = nn.Parameter(torch.empty(1, d))
        self.c0 = nn.Parameter(torch.empty(1, d))
        self.ptr_ref = nn.Linear(d, d, bias=False)  # W1 (on the node encodings)
        self.ptr_query = nn.Linear(d, d)  # W2 (on the LSTM state)
        self.ptr_v = nn.Parameter(torch.empty(d, 1))  # V
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The authors' initialisation: Xavier-uniform for weights with 2+ dimensions in their
        layouts (per-head projections ``[H, d, d_k]``); biases and layer norms PyTorch's."""
        h, d = self.cfg.n_heads, self.cfg.d_model
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            with torch.no_grad():
                if name.endswith(".qv.weight"):
                    halves = [nn.init.xavier_uniform_(torch.empty(h, d, d // h)) for _ in "qv"]
                    p.copy_(torch.cat([heads_to_linear(w) for w in halves]))
                elif name.endswith(".k.weight"):
                    p.copy_(heads_to_linear(nn.init.xavier_uniform_(torch.empty(h, d, d // h))))
                else:
                    nn.init.xavier_uniform_(p)

    def embed_static(self, static: torch.Tensor) -> torch.Tensor:
        """``tanh(L1 · static)`` [..., d/2] (computed once per instance)."""
        return torch.tanh(self.static_embed(static))

    def embed(self, static_emb: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        """Node inputs ``[static_emb, tanh(L2 · dynamic)]`` [R, m, d]."""
        return embed_rows(static_emb, dynamic, self.dynamic_embed.weight, self.dynamic_embed.bias)

    def encode(self, x: torch.Tensor, rec: torch.Tensor, layout: Layout,
               rec_rows: torch.Tensor | None = None, key_weight: torch.Tensor | None = None,
               ) -> torch.Tensor:
        """One set-encoder pass over the packed rows ``x[N, d]``. ``rec``: the previous pass's
        output, ``rec_rows`` its row for each row of ``x`` (None: the same rows); keys are
        projected from ``rec``, then gathered (rows shared by beam siblings projected once)."""
        d = x.shape[1]
        if self.cfg.recursion:
            # every layer's keys in one product
            keys = linear(rec, self.key_weight() if key_weight is None else key_weight)
            rows = layout.gather if rec_rows is None else rec_rows.index_select(0, layout.gather)
            for layer, k in zip(self.layers, keys.split(d, dim=1), strict=True):
                x = layer(x, k.index_select(0, rows), layout)
        else:
            for layer in self.layers:
                x = layer(x, linear(x, layer.k.weight).index_select(0, layout.gather), layout)
        return x

    def key_weight(self) -> torch.Tensor:
        """Every layer's key projection in one weight ``[n_layers·d, d]``."""
        return torch.cat([layer.k.weight for layer in self.layers])

    def encode_dense(self, x: torch.Tensor, rec: torch.Tensor, bias: torch.Tensor,
                     ) -> torch.Tensor:
        """:meth:`encode` on full route-major tables ``[R·n, d]`` (the static rollout)."""
        d = x.shape[1]
        if self.cfg.recursion:
            keys = linear(rec, self.key_weight())
            for i, layer in enumerate(self.layers):
                x = layer.dense(x, keys[:, i * d:(i + 1) * d], bias)
        else:
            for layer in self.layers:
                x = layer.dense(x, linear(x, layer.k.weight), bias)
        return x

    def initial_state(self, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """LSTM state ``(h0, c0)`` for ``r`` routes."""
        return self.h0.expand(r, -1), self.c0.expand(r, -1)

    def pointer(self, enc: torch.Tensor, h: torch.Tensor, route: torch.Tensor) -> torch.Tensor:
        """Logits [N]: ``C·tanh(Vᵀ tanh(W1 enc_j + W2 h))`` for rows ``enc[N, d]`` of routes
        ``route[N]`` with LSTM states ``h[R, d]`` (the caller masks inadmissible rows)."""
        query = F.linear(h, self.ptr_query.weight, self.ptr_query.bias)
        return pointer_logits(enc, self.ptr_ref.weight, query, route, self.ptr_v.squeeze(1),
                              self.cfg.clip)
