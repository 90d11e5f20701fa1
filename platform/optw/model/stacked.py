"""A pack of P independent pointer networks evaluated in one batched pass (weights stacked).

:class:`StackedPointerNet` holds every parameter of P :class:`~optw.model.PointerNet` models
of one :class:`~optw.model.ModelConfig` as one tensor with a leading member dimension. Rows of
the P models are laid out in a padded table ``[P, M, d]`` (:class:`Groups`), so every linear
layer of all members is one batched matrix product (``baddbmm``), layer norms and the pointer's
``V`` broadcast per member, and attention (which has no weights) runs on the decoder's buckets
of all members' routes at once. Each member computes exactly what its own network computes
(the same blocks in the same order; only floating-point rounding differs), and gradients reach
each member's slice only from its own rows.

:meth:`StackedPointerNet.member` gives member p back as a plain ``PointerNet`` (validation,
checkpoints, model files).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from optw.model import fastops
from optw.model.config import ModelConfig
from optw.model.network import Layout, PointerNet, bucket_attention


@dataclass
class Groups:
    """Rows ``[N]`` of P members in a padded table ``[P, M]``: row i sits at ``pos[i]``
    (``member * M + rank among its member's rows``). Padding slots are zeros on the way in and
    never read on the way out."""

    member: torch.Tensor
    pos: torch.Tensor
    n_members: int
    width: int
    counts: list[int]  # real rows of each member (the first ones of its table)

    @staticmethod
    def of(member: torch.Tensor, n_members: int) -> Groups:
        counts = torch.bincount(member, minlength=n_members)
        width = max(int(counts.max()) if member.numel() else 1, 1)
        order = torch.argsort(member, stable=True)
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.empty_like(member)
        rank[order] = torch.arange(member.shape[0], device=member.device) - starts.index_select(
            0, member.index_select(0, order))
        return Groups(member, member * width + rank, n_members, width, counts.tolist())

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        """``x[N, ...]`` -> ``[P, M, ...]``."""
        flat = x.reshape(x.shape[0], -1)
        out = torch.zeros(self.n_members * self.width, flat.shape[1], dtype=flat.dtype,
                          device=flat.device).index_copy_(0, self.pos, flat)
        return out.view(self.n_members, self.width, *x.shape[1:])

    def gather(self, y: torch.Tensor) -> torch.Tensor:
        """``y[P, M, ...]`` -> ``[N, ...]``."""
        return y.reshape(self.n_members * self.width, *y.shape[2:]).index_select(0, self.pos)


def _mm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x·wᵀ + b`` for one member's rows (oneDNN on CPU where it pays, see fastops)."""
    if fastops.fast_rows(x):
        return fastops.raw_linear(x, w, b)
    return F.linear(x, w, b)


class _GroupedLinear(torch.autograd.Function):
    """``y[p, :c_p] = x[p, :c_p]·W[p]ᵀ + b[p]`` for each member's ``c_p`` real rows only (the
    padding rows stay 0): one product per member at its own size, no padding computed."""

    @staticmethod
    def forward(ctx, x, w, b, counts):  # noqa: D102
        y = x.new_empty(x.shape[0], x.shape[1], w.shape[1])
        for p, c in enumerate(counts):
            if c:
                y[p, :c] = _mm(x[p, :c], w[p], None if b is None else b[p])
            if c < x.shape[1]:
                y[p, c:].zero_()
        ctx.counts = counts
        ctx.has_bias = b is not None
        ctx.save_for_backward(x, w)
        return y

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        x, w = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        gx = torch.empty_like(x) if need_x else None
        gw = torch.empty_like(w) if need_w else None
        gb = g.new_zeros(w.shape[0], w.shape[1]) if need_b and ctx.has_bias else None
        for p, c in enumerate(ctx.counts):
            if gx is not None and c < x.shape[1]:
                gx[p, c:].zero_()
            if not c:
                if gw is not None:
                    gw[p].zero_()
                continue
            gp = g[p, :c].contiguous()
            if gx is not None:
                gx[p, :c] = _mm(gp, w[p].t().contiguous(), None)
            if gw is not None:
                torch.mm(gp.t(), x[p, :c], out=gw[p])
            if gb is not None:
                torch.sum(gp, 0, out=gb[p])
        return gx, gw, gb, None


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """Layer norm of ``x[P, M, d]`` with member weights ``w, b [P, d]``."""
    return torch.addcmul(b.unsqueeze(1), F.layer_norm(x, x.shape[-1:], eps=eps), w.unsqueeze(1))


class StackedPointerNet(nn.Module):
    """P pointer networks of one config with stacked weights (see the module docstring)."""

    def __init__(self, models: list[PointerNet]):
        super().__init__()
        if not models:
            raise ValueError("a pack needs at least one model")
        cfg = models[0].cfg
        for i, m in enumerate(models[1:], 1):
            if m.cfg.to_dict() != cfg.to_dict():
                raise ValueError(f"pack member {i} has another model config than member 0 "
                                 f"({m.cfg.to_dict()} vs {cfg.to_dict()})")
        self.cfg = cfg
        self.n_members = len(models)
        self.names = [name for name, _ in models[0].named_parameters()]
        self._index = {name: i for i, name in enumerate(self.names)}
        self.weights = nn.ParameterList(
            nn.Parameter(torch.stack([dict(m.named_parameters())[name].detach() for m in models]))
            for name in self.names)
        self.eps = models[0].layers[0].norm1.eps

    # --- members ------------------------------------------------------------------------------
    def w(self, name: str) -> torch.Tensor:
        """The stacked parameter ``name`` of ``PointerNet`` ([P, ...])."""
        return self.weights[self._index[name]]

    def member(self, p: int) -> PointerNet:
        """Member ``p`` as a plain ``PointerNet`` (a copy of its weights, on their device)."""
        with torch.random.fork_rng(devices=[]):  # its random init must not move torch's RNG
            net = PointerNet(ModelConfig.from_dict(self.cfg.to_dict()))
        net.load_state_dict({name: w[p].detach().clone() for name, w in zip(
            self.names, self.weights, strict=True)})
        return net.to(self.weights[0].device)

    # --- blocks (rows in a padded table [P, M, d]) --------------------------------------------
    def _linear(self, x: torch.Tensor, weight: str, bias: str | None = None,
                groups: Groups | None = None) -> torch.Tensor:
        """Each member's linear layer on its rows of ``x[P, M, in]``: on a GPU one batched
        product over the whole table; on the CPU (with ``groups``) one product per member over
        its real rows only (no padding computed, oneDNN kernels)."""
        return self._grouped(x, self.w(weight), None if bias is None else self.w(bias), groups)

    @staticmethod
    def _grouped(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                 groups: Groups | None) -> torch.Tensor:
        if groups is not None and x.device.type == "cpu":
            return _GroupedLinear.apply(x, w, b, groups.counts)
        if b is None:
            return torch.bmm(x, w.transpose(1, 2))
        return torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))

    def embed_static(self, static: torch.Tensor, tourists: Groups) -> torch.Tensor:
        """``tanh(L1 · static)`` [K, n, d/2] for ``static[K, n, 7]`` of tourists ``tourists``."""
        k, n, f = static.shape
        x = tourists.scatter(static).view(self.n_members, -1, f)
        per_member = Groups(tourists.member, tourists.pos, tourists.n_members, tourists.width * n,
                            [c * n for c in tourists.counts])
        emb = torch.tanh(self._linear(x, "static_embed.weight", "static_embed.bias",
                                      per_member))
        return tourists.gather(emb.view(self.n_members, tourists.width, n, -1))

    def embed(self, static_emb: torch.Tensor, dynamic: torch.Tensor, rows: Groups) -> torch.Tensor:
        """Node inputs ``[static_emb, tanh(L2 · dynamic)]`` in the padded table [P, M, d]."""
        dyn = torch.tanh(self._linear(rows.scatter(dynamic), "dynamic_embed.weight",
                                      "dynamic_embed.bias", rows))
        return torch.cat([rows.scatter(static_emb), dyn], dim=2)

    def encode(self, x: torch.Tensor, rec: torch.Tensor, layout: Layout, rows: Groups,
               ) -> torch.Tensor:
        """One set-encoder pass: ``x`` and the recursion input ``rec`` are padded tables
        [P, M, d] of the rows of ``layout`` (``rows``); returns the same layout."""
        p, width, d = x.shape
        n_rows = rows.pos.shape[0]
        table = rows.pos.index_select(0, layout.gather)  # padded slot of each attention entry
        back = torch.zeros(p * width, dtype=torch.long, device=x.device).index_copy(
            0, rows.pos, layout.back[:n_rows])
        n_layers = self.cfg.n_layers
        if self.cfg.recursion:
            w = torch.cat([self.w(f"layers.{i}.k.weight") for i in range(n_layers)], dim=1)
            keys = self._grouped(rec, w, None, rows).view(p * width, -1)
        for i in range(n_layers):
            pre = f"layers.{i}."
            if not self.cfg.recursion:
                keys = self._linear(x, pre + "k.weight", None, rows).view(p * width, -1)
                k_all = keys.index_select(0, table)
            else:
                k_all = keys[:, i * d:(i + 1) * d].index_select(0, table)
            qv = self._linear(x, pre + "qv.weight", None, rows).view(p * width, 2 * d)
            q_all = qv[:, :d].index_select(0, table)
            v_all = qv[:, d:].index_select(0, table)
            o = bucket_attention(q_all, k_all, v_all, layout, self.cfg.n_heads)
            z = self._linear(o.index_select(0, back).view(p, width, d), pre + "out.weight",
                             pre + "out.bias", rows) + x
            y = _layer_norm(z, self.w(pre + "norm1.weight"), self.w(pre + "norm1.bias"),
                            self.eps)
            f = torch.relu(self._linear(y, pre + "ff1.weight", pre + "ff1.bias", rows))
            z = self._linear(f, pre + "ff2.weight", pre + "ff2.bias", rows) + y
            x = _layer_norm(z, self.w(pre + "norm2.weight"), self.w(pre + "norm2.bias"),
                            self.eps)
        return x

    def initial_state(self, member: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """LSTM state ``(h0, c0)`` of each route's member (``member[R]``)."""
        return (self.w("h0")[:, 0].index_select(0, member),
                self.w("c0")[:, 0].index_select(0, member))

    def lstm(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, routes: Groups,
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One LSTM-cell step of routes ``routes`` (``x, h, c`` [R, d]), PyTorch's gate order."""
        gates = routes.gather(
            self._grouped(routes.scatter(x), self.w("lstm.weight_ih"),
                          self.w("lstm.bias_ih") + self.w("lstm.bias_hh"), routes)
            + self._grouped(routes.scatter(h), self.w("lstm.weight_hh"), None, routes))
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    def pointer(self, enc: torch.Tensor, h: torch.Tensor, rows: Groups, route: torch.Tensor,
                routes: Groups) -> torch.Tensor:
        """Logits [N] of the rows ``rows`` (``enc`` their padded table, ``route[N]`` their
        route) for routes with LSTM states ``h[R, d]`` (``routes``)."""
        query = routes.gather(self._linear(routes.scatter(h), "ptr_query.weight",
                                           "ptr_query.bias", routes))
        u = torch.tanh(self._linear(enc, "ptr_ref.weight", None, rows)
                       + rows.scatter(query.index_select(0, route)))
        t = torch.tanh(torch.bmm(u, self.w("ptr_v")))  # [P, M, 1]
        return self.cfg.clip * rows.gather(t).squeeze(1)
