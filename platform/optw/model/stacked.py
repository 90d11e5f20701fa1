"""A pack of P independent pointer networks evaluated in one batched pass (weights stacked).

:class:`StackedPointerNet` holds each parameter of P :class:`~optw.model.PointerNet` models of
one config as one tensor with a leading member dimension. Rows stay packed ``[N, d]``, grouped
by member in ascending order (:class:`Groups`). A member's linear layer is one product on its
own slice on the CPU, one batched product over a padded ``[P, M, ·]`` table on a GPU (made only
inside the product, so a pack's activation memory is about its members' own). Attention runs on
all members' buckets at once. Each member computes what its own network computes (up to float
rounding), and its slice gets gradients only from its own rows.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from optw.model import fastops
from optw.model.network import Layout, PointerNet, bucket_attention


@dataclass
class Groups:
    """Rows ``[N]`` of P members in member order (member p's: ``starts[p]`` on, ``counts[p]``);
    ``pos[i]``: row i's slot in a padded table ``[P, width]``."""

    member: torch.Tensor
    pos: torch.Tensor
    n_members: int
    width: int
    counts: list[int]
    starts: list[int]

    @staticmethod
    def of(member: torch.Tensor, n_members: int) -> Groups:
        """The groups of ``member[N]`` (non-decreasing, as the decoder lays rows out)."""
        counts_t = torch.bincount(member, minlength=n_members)
        counts = counts_t.tolist()
        width = max(max(counts, default=0), 1)
        starts = [0, *itertools.accumulate(counts)][:-1]
        first = torch.cumsum(counts_t, 0) - counts_t
        rank = torch.arange(member.shape[0], device=member.device) - first.index_select(
            0, member)
        return Groups(member, member * width + rank, n_members, width, counts, starts)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """Packed rows ``x[N, f]`` -> the padded table ``[P, width, f]`` (padding zeros)."""
        out = x.new_zeros(self.n_members * self.width, x.shape[1]).index_copy_(0, self.pos, x)
        return out.view(self.n_members, self.width, x.shape[1])

    def unpad(self, y: torch.Tensor) -> torch.Tensor:
        """The padded table ``y[P, width, f]`` -> packed rows ``[N, f]``."""
        return y.reshape(self.n_members * self.width, y.shape[2]).index_select(0, self.pos)


def _mm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x·wᵀ + b`` for one member's rows (:mod:`~optw.model.fastops` where it pays)."""
    if fastops.fast_rows(x):
        return fastops.raw_linear(x, w, b)
    return F.linear(x, w, b)


def _batched(x: torch.Tensor) -> bool:
    """Whether all members' products are one batched product (GPUs), not one per member."""
    return x.device.type != "cpu"


class _MemberLinear(torch.autograd.Function):
    """``y_i = x_{index_i}·W[m_i]ᵀ + b[m_i]`` for rows ``index`` (None: all) of members ``m``
    (``groups``); the backward keeps ``x`` (kept by its producer anyway), not the gathered rows."""

    @staticmethod
    def forward(ctx, x, w, b, groups, index):
        ctx.groups = groups
        ctx.has_bias = b is not None
        ctx.save_for_backward(x, w, index)
        if index is not None:
            x = x.index_select(0, index)
        if _batched(x):
            xp = groups.pad(x)
            y = (torch.bmm(xp, w.transpose(1, 2)) if b is None
                 else torch.baddbmm(b.unsqueeze(1), xp, w.transpose(1, 2)))
            return groups.unpad(y)
        y = x.new_empty(x.shape[0], w.shape[1])
        for p, (s, c) in enumerate(zip(groups.starts, groups.counts, strict=True)):
            if c:
                y[s:s + c] = _mm(x[s:s + c], w[p], None if b is None else b[p])
        return y

    @staticmethod
    def backward(ctx, g):
        x_in, w, index = ctx.saved_tensors
        x = x_in if index is None else x_in.index_select(0, index)
        groups: Groups = ctx.groups
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        need_b = need_b and ctx.has_bias
        gx = gw = gb = None
        if _batched(x):
            gp = groups.pad(g.contiguous())
            if need_x:
                gx = groups.unpad(torch.bmm(gp, w))
            if need_w:
                gw = torch.bmm(gp.transpose(1, 2), groups.pad(x))
            if need_b:
                gb = gp.sum(1)
        else:
            gx = torch.empty_like(x) if need_x else None
            gw = torch.zeros_like(w) if need_w else None
            gb = g.new_zeros(w.shape[0], w.shape[1]) if need_b else None
            for p, (s, c) in enumerate(zip(groups.starts, groups.counts, strict=True)):
                if not c:
                    continue
                gs = g[s:s + c].contiguous()
                if gx is not None:
                    gx[s:s + c] = _mm(gs, w[p].t().contiguous(), None)
                if gw is not None:
                    torch.mm(gs.t(), x[s:s + c], out=gw[p])
                if gb is not None:
                    torch.sum(gs, 0, out=gb[p])
        if gx is not None and index is not None:
            gx = torch.zeros_like(x_in).index_add_(0, index, gx)
        return gx, gw, gb, None, None


class _MemberLayerNorm(torch.autograd.Function):
    """Layer norm of packed rows ``x[N, d]`` with each row's member's ``w, b [P, d]``; the
    backward recovers the normalised rows from the output as the single model's does."""

    @staticmethod
    def forward(ctx, x, w, b, member, eps):
        xhat, _, rstd = torch.native_layer_norm(x, x.shape[1:], None, None, eps)
        y = torch.addcmul(b.index_select(0, member), xhat, w.index_select(0, member))
        ctx.from_output = fastops.ln_weight_ok(w)
        ctx.save_for_backward(y if ctx.from_output else xhat, rstd, w, b, member)
        return y

    @staticmethod
    def backward(ctx, g):
        kept, rstd, w, b, member = ctx.saved_tensors
        w_rows = w.index_select(0, member)
        xhat = (kept - b.index_select(0, member)) / w_rows if ctx.from_output else kept
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:  # PyTorch's kernel, the member weights folded into g
            gx = torch.ops.aten.native_layer_norm_backward(
                (g * w_rows).contiguous(), xhat / rstd, xhat.shape[1:], torch.zeros_like(rstd),
                rstd, None, None, [True, False, False])[0]
        if ctx.needs_input_grad[1]:
            gw = torch.zeros_like(w).index_add_(0, member, g * xhat)
        if ctx.needs_input_grad[2]:
            gb = torch.zeros_like(w).index_add_(0, member, g)
        return gx, gw, gb, None, None


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

    def w(self, name: str) -> torch.Tensor:
        """The stacked parameter ``name`` of ``PointerNet`` ([P, ...])."""
        return self.weights[self._index[name]]

    def member(self, p: int) -> PointerNet:
        """Member ``p`` as a plain ``PointerNet`` (a copy of its weights, on their device)."""
        with torch.random.fork_rng(devices=[]):  # its random init must not move torch's RNG
            net = PointerNet(self.cfg)
        net.load_state_dict({name: w[p].detach().clone() for name, w in zip(
            self.names, self.weights, strict=True)})
        return net.to(self.weights[0].device)

    def _linear(self, x: torch.Tensor, weight: str, bias: str | None, groups: Groups,
                index: torch.Tensor | None = None) -> torch.Tensor:
        """Each member's linear layer on its rows of the packed ``x[N, in]`` (or ``x[index]``)."""
        return _MemberLinear.apply(x, self.w(weight), None if bias is None else self.w(bias),
                                   groups, index)

    def _layer_norm(self, x: torch.Tensor, name: str, rows: Groups) -> torch.Tensor:
        """Each member's layer norm ``name`` on its rows of the packed ``x[N, d]``."""
        return _MemberLayerNorm.apply(x, self.w(name + ".weight"), self.w(name + ".bias"),
                                      rows.member, self.eps)

    def embed_static(self, static: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
        """``tanh(L1 · static)`` [K, n, d/2] for ``static[K, n, 7]`` of members ``member[K]``."""
        k, n, f = static.shape
        emb = self._linear(static.reshape(k * n, f), "static_embed.weight", "static_embed.bias",
                           Groups.of(member.repeat_interleave(n), self.n_members))
        return torch.tanh(emb).view(k, n, -1)

    def embed(self, static_emb: torch.Tensor, dynamic: torch.Tensor, rows: Groups) -> torch.Tensor:
        """Node inputs ``[static_emb, tanh(L2 · dynamic)]`` [N, d] of the packed rows."""
        dyn = torch.tanh(self._linear(dynamic, "dynamic_embed.weight", "dynamic_embed.bias",
                                      rows))
        return torch.cat([static_emb, dyn], dim=1)

    def encode(self, x: torch.Tensor, rec: torch.Tensor, layout: Layout, rows: Groups,
               rec_rows: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`PointerNet.encode` of the packed rows ``x[N, d]`` of members ``rows``."""
        d = x.shape[1]
        n_layers = self.cfg.n_layers
        back = layout.back[:x.shape[0]]
        if self.cfg.recursion:
            w = torch.cat([self.w(f"layers.{i}.k.weight") for i in range(n_layers)], dim=1)
            keys = _MemberLinear.apply(rec, w, None, rows, rec_rows)
        for i in range(n_layers):
            pre = f"layers.{i}."
            if self.cfg.recursion:
                k_all = keys[:, i * d:(i + 1) * d].index_select(0, layout.gather)
            else:
                k_all = self._linear(x, pre + "k.weight", None, rows).index_select(
                    0, layout.gather)
            q, v = self._linear(x, pre + "qv.weight", None, rows).split(d, dim=1)
            o = bucket_attention(q.index_select(0, layout.gather), k_all,
                                 v.index_select(0, layout.gather), layout, self.cfg.n_heads)
            z = self._linear(o, pre + "out.weight", pre + "out.bias", rows, back) + x
            y = self._layer_norm(z, pre + "norm1", rows)
            f = torch.relu(self._linear(y, pre + "ff1.weight", pre + "ff1.bias", rows))
            z = self._linear(f, pre + "ff2.weight", pre + "ff2.bias", rows) + y
            x = self._layer_norm(z, pre + "norm2", rows)
        return x

    def initial_state(self, member: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """LSTM state ``(h0, c0)`` of each route's member (``member[R]``)."""
        return (self.w("h0")[:, 0].index_select(0, member),
                self.w("c0")[:, 0].index_select(0, member))

    def lstm(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, routes: Groups,
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One LSTM-cell step of routes ``routes`` (``x, h, c`` [R, d]), PyTorch's gate order."""
        gates = (_MemberLinear.apply(x, self.w("lstm.weight_ih"),
                                     self.w("lstm.bias_ih") + self.w("lstm.bias_hh"), routes, None)
                 + self._linear(h, "lstm.weight_hh", None, routes))
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    def pointer(self, enc: torch.Tensor, h: torch.Tensor, rows: Groups, route: torch.Tensor,
                routes: Groups) -> torch.Tensor:
        """Logits [N] of rows ``enc[N, d]`` of routes ``route[N]``, LSTM states ``h[R, d]``."""
        query = self._linear(h, "ptr_query.weight", "ptr_query.bias", routes)
        u = torch.tanh(self._linear(enc, "ptr_ref.weight", None, rows)
                       + query.index_select(0, route))
        t = _MemberLinear.apply(u, self.w("ptr_v").transpose(1, 2), None, rows, None)  # [N, 1]
        return self.cfg.clip * torch.tanh(t).squeeze(1)
