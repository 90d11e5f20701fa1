"""A pack of P pointer networks three ways: the hand-written stacked model, ``torch.func.vmap``
over P copies, and a Python loop over the members. CPU, one thread.

The question: could ``torch.func.stack_module_state`` + ``vmap(functional_call(...))`` over P
copies of :class:`optw.model.network.PointerNet` replace :class:`optw.model.stacked.
StackedPointerNet` (``train_pack``'s model, ``decode/core.py``'s pack decoder)? Members are
Solomon regions (all 102 nodes: no padding) with fresh networks seeded as ``train_pack`` seeds
them; each way does the same work, interleaved over ``--repeats`` rounds (medians of wall and
of CPU time reported; ratios use CPU time, robust on a loaded machine):

- ``stacked``: the stacked model's public blocks (``embed``, ``encode``, ``lstm``, ``pointer``)
  on a DENSE decode of all members at once: R = K·B routes per member, all n rows per pass,
  the first pass and T steps, then the members' summed REINFORCE losses and their backward.
  The reference of the ratios.
- ``vmap``: the same decode and backward as a plain-PyTorch member step (``PointerNet``'s math
  in ``F.linear``, ``F.layer_norm``, ``F.scaled_dot_product_attention`` and torch ops; checked
  against ``PointerNet`` itself), its weights from ``stack_module_state`` of the P networks, run
  as ``vmap(functional_call(base, (params, buffers), args))``. ``vmap-math`` (opt-in): the
  attention as batched products, which vmap batches (its fused CPU kernel has no rule).
- ``loop``: the same plain step member after member, each with its own network's weights.
  ``loop-net`` (opt-in): through ``PointerNet``'s own methods (``fastops``), as ``train``.
- ``stacked-epoch``: a real pack epoch as ``train_pack`` runs it (each member's K tourists, ONE
  compacted sampling rollout, the losses, backward, per-member clipping, the stacked Adam).
  The work vmap cannot do (its shapes depend on the data); ``loop-epoch``: the same epoch member
  after member as ``train`` runs it (``optw.train.step.reinforce_step``).

The dense decode's inputs are real: each member's network samples its routes with
``optw.decode.static.static_rollout`` (untimed) and the environment is replayed along them,
recording every pass's dynamic features, lookahead-graph attention bias, admissible mask and
chosen node (routes that ended take the end, as in the static rollout; longer ones are cut at
T). Each pass is the same work whatever T, so the ratios do not depend on T; memory does:
the backward keeps every pass (vmap, P = 14: about 0.5 GB per pass, a 3.9 GB peak at T = 6,
10 GB at T = 20), and a pack whose estimate would crowd the available memory is skipped.

Before timing it checks that the plain step matches ``PointerNet`` (log-probabilities,
entropies, gradients), and probes what breaks when ``PointerNet`` itself is vmapped; the table
says how each way's outputs and gradients agree with its reference. Run (about 4 minutes of
CPU at the defaults, P = 4, 8, 14 and T = 6; ``--quick`` about one)::

    .venv/bin/python benchmarks/bench_vmap.py
    .venv/bin/python benchmarks/bench_vmap.py --quick
    .venv/bin/python benchmarks/bench_vmap.py --ways stacked-epoch,loop-epoch --tourists 4
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import math
import os
import re
import resource
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))

from optw.catalog import Catalog, open_catalog  # noqa: E402
from optw.decode.core import route_reward  # noqa: E402
from optw.decode.reinforce import reinforce_loss  # noqa: E402
from optw.decode.static import static_rollout  # noqa: E402
from optw.env import stack_instances  # noqa: E402
from optw.env.instances import Instances  # noqa: E402
from optw.env.state import Features, adjacency, still_admissible, visit_end  # noqa: E402
from optw.model import ModelConfig, PointerNet, fastops  # noqa: E402
from optw.model.network import Bucket, Layout, graph_bias  # noqa: E402
from optw.model.stacked import Groups, StackedPointerNet  # noqa: E402
from optw.train.config import TrainConfig  # noqa: E402
from optw.train.loop import tourist_batch  # noqa: E402
from optw.train.pack import StackedAdam, pack_step  # noqa: E402
from optw.train.step import make_optimizer, reinforce_step  # noqa: E402

#: 14 Solomon regions (all 102 nodes: 100 points, start, end), a mix of the six classes.
REGIONS = ["c101", "r101", "rc101", "c201", "r201", "rc201", "c102", "r102", "rc102", "c202",
           "r202", "rc202", "c103", "r103"]
#: what ``--ways`` may name (the first five are the default)
WAYS = ("stacked-epoch", "loop-epoch", "stacked", "vmap", "loop", "vmap-math", "loop-net")
DEFAULT_WAYS = WAYS[:5]
EPOCH_WAYS = ("stacked-epoch", "loop-epoch")
BETA = 0.01  # the entropy bonus of the paper's recipe
#: Memory a dense decode keeps per node row and pass for its backward, with a margin (measured:
#: about 22 kB with vmap over the plain step, 19 kB for the plain loop, 13 kB stacked).
ROW_PASS_BYTES = 28 << 10
#: A pack runs when that estimate is at most this share of the available memory: the peak
#: resident size is about 1.5 times it (the decoder's allocator setting, optw.allocator, keeps
#: freed heap blocks between the ways), which leaves a third of it to the machine's other work.
MEMORY_SHARE = 0.45
Params = Callable[[str], torch.Tensor]


# --- the plain member step: PointerNet's math in plain PyTorch ops ---------------------------
def _attr(module: nn.Module, name: str) -> torch.Tensor:
    """``module``'s tensor at the dotted ``name`` (as ``functional_call`` has swapped it in)."""
    return functools.reduce(getattr, name.split("."), module)  # type: ignore[arg-type]


def products(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
             scale: float) -> torch.Tensor:
    """Attention as batched products (ops vmap batches, unlike the CPU's fused kernel)."""
    return torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * scale + bias, -1),
                        v)


def plain_layer(p: Params, i: int, x: torch.Tensor, keys: torch.Tensor, bias: torch.Tensor,
                n_heads: int, eps: float, math_attention: bool = False) -> torch.Tensor:
    """``EncoderLayer.dense``: graph-masked attention (keys given), post-norm feed-forward;
    ``math_attention``: the attention as :func:`products`, else PyTorch's fused kernel."""
    pre = f"layers.{i}."
    r, n = bias.shape[0], bias.shape[-1]
    d = x.shape[1]
    dk = d // n_heads
    qv = F.linear(x, p(pre + "qv.weight"))
    q, v, k = (t.reshape(r, n, n_heads, dk).transpose(1, 2)
               for t in (qv[:, :d], qv[:, d:], keys))
    if math_attention:
        o = products(q, k, v, bias, 1.0 / math.sqrt(dk))
    else:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0 / math.sqrt(dk))
    z = F.linear(o.transpose(1, 2).reshape(r * n, d), p(pre + "out.weight"),
                 p(pre + "out.bias")) + x
    y = F.layer_norm(z, (d,), p(pre + "norm1.weight"), p(pre + "norm1.bias"), eps)
    z = y + F.linear(torch.relu(F.linear(y, p(pre + "ff1.weight"), p(pre + "ff1.bias"))),
                     p(pre + "ff2.weight"), p(pre + "ff2.bias"))
    return F.layer_norm(z, (d,), p(pre + "norm2.weight"), p(pre + "norm2.bias"), eps)


def lstm_step(x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, w_ih: torch.Tensor,
              w_hh: torch.Tensor, b_ih: torch.Tensor, b_hh: torch.Tensor,
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``nn.LSTMCell``'s step in plain ops (PyTorch's gate order i, f, g, o)."""
    gi, gf, gg, go = (F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh)).chunk(4, 1)
    c = torch.sigmoid(gf) * c + torch.sigmoid(gi) * torch.tanh(gg)
    return torch.sigmoid(go) * torch.tanh(c), c


def _chosen(logits: torch.Tensor, ok: torch.Tensor, ch: torch.Tensor, enc: torch.Tensor,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step's log-probability of the chosen nodes ``ch[R]`` under the admissible mask
    ``ok[R, n]``, its entropy, and the chosen nodes' encodings ``enc[R, n, d]`` (next LSTM
    input)."""
    logp = torch.log_softmax(logits.masked_fill(~ok, float("-inf")), dim=1)
    d = enc.shape[2]
    return (logp.gather(1, ch.unsqueeze(1)).squeeze(1),
            -(logp.exp() * logp.masked_fill(~ok, 0.0)).sum(1),
            enc.gather(1, ch.view(-1, 1, 1).expand(-1, 1, d)).squeeze(1))


def plain_decode(p: Params, cfg: ModelConfig, eps: float, static: torch.Tensor,
                 tid: torch.Tensor, dyn: torch.Tensor, bias: torch.Tensor,
                 allowed: torch.Tensor, choice: torch.Tensor, math_attention: bool = False,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """One member's dense decode: summed log-probabilities and entropies [R] of the routes that
    take ``choice[T, R]``, from the static features ``static[K, n, 7]`` of its tourists
    (``tid[R]``: each route's), each pass's ``dyn[T+1, R·n, 8]`` and ``bias[T+1, R, 1, n, n]``,
    each step's ``allowed[T, R, n]``. The same math as :func:`net_decode`."""
    r, n, d, n_layers = tid.shape[0], static.shape[-2], cfg.d_model, cfg.n_layers
    emb = torch.tanh(F.linear(static, p("static_embed.weight"), p("static_embed.bias")))
    static_rows = emb.index_select(0, tid).reshape(r * n, d // 2)
    w_dyn, b_dyn = p("dynamic_embed.weight"), p("dynamic_embed.bias")
    key_w = torch.cat([p(f"layers.{i}.k.weight") for i in range(n_layers)])

    def encode(dyn_s: torch.Tensor, rec: torch.Tensor | None, bias_s: torch.Tensor,
               ) -> torch.Tensor:
        x = torch.cat([static_rows, torch.tanh(F.linear(dyn_s, w_dyn, b_dyn))], dim=1)
        keys = F.linear(x if rec is None else rec, key_w)
        for i in range(n_layers):
            x = plain_layer(p, i, x, keys[:, i * d:(i + 1) * d], bias_s, cfg.n_heads, eps,
                            math_attention)
        return x

    prev = encode(dyn[0], None, bias[0])
    lstm_in = prev.reshape(r, n, d)[:, 0]
    h, c = p("h0").expand(r, d), p("c0").expand(r, d)
    w_ih, w_hh, b_ih, b_hh = (p("lstm." + s) for s in ("weight_ih", "weight_hh", "bias_ih",
                                                        "bias_hh"))
    w_ref, w_q, b_q, v = (p(s) for s in ("ptr_ref.weight", "ptr_query.weight", "ptr_query.bias",
                                          "ptr_v"))
    lps, ents = [], []
    for s in range(choice.shape[0]):
        enc = encode(dyn[s + 1], prev, bias[s + 1])
        h, c = lstm_step(lstm_in, h, c, w_ih, w_hh, b_ih, b_hh)
        u = torch.tanh(F.linear(enc, w_ref).reshape(r, n, d) + F.linear(h, w_q, b_q).unsqueeze(1))
        logits = cfg.clip * torch.tanh(torch.matmul(u, v).squeeze(2))
        lp, ent, lstm_in = _chosen(logits, allowed[s], choice[s], enc.reshape(r, n, d))
        lps.append(lp)
        ents.append(ent)
        prev = enc
    return torch.stack(lps).sum(0), torch.stack(ents).sum(0)


class PlainMember(nn.Module):
    """A member's dense decode by :func:`plain_decode`, reading the weights of ``net``."""

    def __init__(self, net: PointerNet, math_attention: bool = False):
        super().__init__()
        self.net = net
        self.eps = net.layers[0].norm1.eps
        self.math_attention = math_attention

    def forward(self, static: torch.Tensor, tid: torch.Tensor, dyn: torch.Tensor,
                bias: torch.Tensor, allowed: torch.Tensor, choice: torch.Tensor,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return plain_decode(functools.partial(_attr, self.net), self.net.cfg, self.eps, static,
                            tid, dyn, bias, allowed, choice, self.math_attention)


def net_decode(net: PointerNet, static: torch.Tensor, tid: torch.Tensor, dyn: torch.Tensor,
               bias: torch.Tensor, allowed: torch.Tensor, choice: torch.Tensor,
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`plain_decode` through ``PointerNet``'s own methods (as ``static_rollout``)."""
    r, n, d = tid.shape[0], static.shape[-2], net.cfg.d_model
    static_rows = net.embed_static(static).index_select(0, tid).reshape(r * n, d // 2)
    row_route = torch.arange(r).repeat_interleave(n)
    x = net.embed(static_rows, dyn[0])
    prev = net.encode_dense(x, x, bias[0])
    lstm_in = prev.reshape(r, n, d)[:, 0]
    h, c = net.initial_state(r)
    lps, ents = [], []
    for s in range(choice.shape[0]):
        enc = net.encode_dense(net.embed(static_rows, dyn[s + 1]), prev, bias[s + 1])
        h, c = net.lstm(lstm_in, (h, c))
        lp, ent, lstm_in = _chosen(net.pointer(enc, h, row_route).reshape(r, n), allowed[s],
                                   choice[s], enc.reshape(r, n, d))
        lps.append(lp)
        ents.append(ent)
        prev = enc
    return torch.stack(lps).sum(0), torch.stack(ents).sum(0)


class NetMember(nn.Module):
    """:func:`net_decode` as a module (for ``functional_call``)."""

    def __init__(self, net: PointerNet):
        super().__init__()
        self.net = net

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return net_decode(self.net, *args)


# --- the work: real routes, replayed into dense per-step inputs ------------------------------
@dataclass
class Work:
    """P members' dense decodes, stacked on a leading member dimension: ``static[P, K, n, 7]``,
    ``dyn[P, T+1, R·n, 8]``, ``bias[P, T+1, R, 1, n, n]``, ``allowed[P, T, R, n]``,
    ``choice[P, T, R]``, ``reward[P, R]``; ``tid[R]`` each route's tourist (all members);
    ``lengths``: the sampled routes' node counts (all members)."""

    static: torch.Tensor
    tid: torch.Tensor
    dyn: torch.Tensor
    bias: torch.Tensor
    allowed: torch.Tensor
    choice: torch.Tensor
    reward: torch.Tensor
    batch: int
    lengths: torch.Tensor

    def member(self, p: int) -> tuple[torch.Tensor, ...]:
        """Member ``p``'s arguments of :func:`plain_decode` / :func:`net_decode`."""
        return (self.static[p], self.tid, self.dyn[p], self.bias[p], self.allowed[p],
                self.choice[p])


def replay(inst: Instances, ids: torch.Tensor, routes: torch.Tensor, steps: int,
           ) -> tuple[torch.Tensor, ...]:
    """Inputs of a dense decode of ``routes`` (from ``static_rollout``) for ``steps`` steps:
    dyn [T+1, R·n, 8], bias [T+1, R, 1, n, n], allowed [T, R, n], choice [T, R]; the
    environment's rules as ``static_rollout`` applies them."""
    r, n = ids.shape[0], inst.n_nodes
    end = n - 1
    rr, col = torch.arange(r), torch.arange(n)
    is_end = col == end
    opening, _, dur, latest = inst.node_u.index_select(0, ids).unbind(-1)
    feat = Features(inst)
    dist = inst.dist_u.index_select(0, ids)
    const, span = feat.const.index_select(0, ids), feat.span.index_select(0, ids)
    dyns, biases, alloweds, choices = [], [], [], []

    def observe(cur: torch.Tensor, t: torch.Tensor, mask: torch.Tensor) -> None:
        travel = dist[rr, cur]
        dyns.append(feat.tables(const, span, t, travel).reshape(r * n, -1))
        biases.append(graph_bias(adjacency(mask, visit_end(t.unsqueeze(1) + travel, opening,
                                                           dur), dist, latest)))

    cur = torch.zeros(r, dtype=torch.long)
    t = inst.t_start_u.index_select(0, ids)
    mask = still_admissible(torch.ones_like(latest, dtype=torch.bool), t, dist[:, 0], latest)
    observe(cur, t, mask)
    mask = mask & (col != 0)
    done = torch.zeros(r, dtype=torch.bool)
    for step in range(1, steps + 1):
        observe(cur, t, mask)
        allowed = mask | (done.unsqueeze(1) & is_end)
        given = routes[:, step] if step < routes.shape[1] else torch.full((r,), -1)
        choice = torch.where(done | (given < 0), end, given)
        if not bool(allowed.gather(1, choice.unsqueeze(1)).all()):
            raise RuntimeError(f"replay: an inadmissible node at step {step}")
        alloweds.append(allowed)
        choices.append(choice)
        live = ~done
        arrival = t + dist[rr, cur, choice]
        t = torch.where(live, visit_end(arrival, opening[rr, choice], dur[rr, choice]), t)
        cur = torch.where(live, choice, cur)
        done = done | (choice == end)
        mask = still_admissible(mask & (col != choice.unsqueeze(1)) & ~done.unsqueeze(1), t,
                                dist[rr, cur], latest)
    return torch.stack(dyns), torch.stack(biases), torch.stack(alloweds), torch.stack(choices)


def make_work(catalog: Catalog, regions: list[str], nets: list[PointerNet], tourists: int,
              batch: int, steps: int, seed: int) -> Work:
    """Each member's ``tourists`` tourists of its region, ``batch`` routes each sampled by its
    own network, replayed for ``steps`` steps."""
    ids = torch.arange(tourists).repeat_interleave(batch)
    parts: list[list[torch.Tensor]] = []
    lengths = []
    for i, (rid, net) in enumerate(zip(regions, nets, strict=True)):
        config = TrainConfig(regions=[rid])
        inst = tourist_batch(catalog.region(rid), tourists, np.random.default_rng(seed + i),
                             config, torch.device("cpu"))
        with torch.no_grad():
            routes, _, _ = static_rollout(net, inst, ids,
                                          generator=torch.Generator().manual_seed(seed + i))
        lengths.append((routes >= 0).sum(1))
        parts.append([inst.static, *replay(inst, ids, routes, steps),
                      route_reward(inst, ids, routes)])
    static, dyn, bias, allowed, choice, reward = (torch.stack(t) for t in zip(*parts,
                                                                             strict=True))
    return Work(static, ids, dyn, bias, allowed, choice, reward, batch, torch.cat(lengths))


def pack_loss(work: Work, lp: torch.Tensor, ent: torch.Tensor) -> torch.Tensor:
    """The members' REINFORCE losses summed (each member's gradient only from its own)."""
    return torch.stack([reinforce_loss(work.reward[p], lp[p], ent[p], work.batch, BETA).loss
                        for p in range(lp.shape[0])]).sum()


# --- the ways -----------------------------------------------------------------------------------
Outputs = tuple[torch.Tensor, torch.Tensor]
#: the way each one's outputs and gradients are checked against
CHECK_AGAINST = {"stacked": "loop", "vmap": "loop", "vmap-math": "loop", "loop-net": "loop",
                 "loop-epoch": "stacked-epoch"}
#: the way each one's time is divided by
RATIO_TO = {"stacked-epoch": "stacked-epoch", "loop-epoch": "stacked-epoch"}


class Way:
    """One way of doing the work: :meth:`run` (timed) does it once and returns two tensors to
    check against another way's (dense decodes: log-probabilities and entropies [P, R];
    epochs: rewards [P, K·B] and losses [P]); the gradients it left by :meth:`grads`."""

    epoch = False  # one call is a training epoch (else a dense decode's forward + backward)

    def run(self) -> Outputs:
        raise NotImplementedError

    def grads(self) -> dict[str, torch.Tensor] | None:
        """Gradients ``[P, ...]`` by ``PointerNet`` parameter name (None: not compared)."""
        return None

    def clear(self) -> None:
        """Drop the gradients (untimed, before each call)."""


class StackedDense(Way):
    """The stacked model's public blocks on the dense decode of all members at once."""

    def __init__(self, nets: list[PointerNet], work: Work):
        self.model = StackedPointerNet(nets).train()
        self.work = work
        p, k, n = work.static.shape[:3]
        r = work.tid.shape[0]
        t1 = work.dyn.shape[1]
        self.shape = (p, r, n)
        self.static = work.static.reshape(p * k, n, -1)
        self.tourist_member = torch.arange(p).repeat_interleave(k)
        self.route_tourist = (torch.arange(p).unsqueeze(1) * k + work.tid).reshape(-1)
        self.rows = Groups.of(torch.arange(p).repeat_interleave(r * n), p)
        self.routes = Groups.of(torch.arange(p).repeat_interleave(r), p)
        self.route = torch.arange(p * r).repeat_interleave(n)
        self.route_member = torch.arange(p).repeat_interleave(r)
        self.dyn = work.dyn.transpose(0, 1).reshape(t1, p * r * n, -1).contiguous()
        every = torch.arange(p * r * n)  # dense tables: one bucket, no padding, no gathers
        bias = work.bias.transpose(0, 1).reshape(t1, p * r, 1, n, n).contiguous()
        self.layouts = [Layout(self.route, every, every, [Bucket(p * r, n, bias[s])])
                        for s in range(t1)]
        self.allowed = work.allowed.transpose(0, 1).reshape(t1 - 1, p * r, n)
        self.choice = work.choice.transpose(0, 1).reshape(t1 - 1, p * r)

    def run(self) -> Outputs:
        m = self.model
        p, r, n = self.shape
        d = m.cfg.d_model
        emb = m.embed_static(self.static, self.tourist_member)
        static_rows = emb.index_select(0, self.route_tourist).reshape(p * r * n, -1)
        x = m.embed(static_rows, self.dyn[0], self.rows)
        prev = m.encode(x, x, self.layouts[0], self.rows)
        lstm_in = prev.reshape(p * r, n, d)[:, 0]
        h, c = m.initial_state(self.route_member)
        lps, ents = [], []
        for s in range(self.choice.shape[0]):
            x = m.embed(static_rows, self.dyn[s + 1], self.rows)
            enc = m.encode(x, prev, self.layouts[s + 1], self.rows)
            h, c = m.lstm(lstm_in, h, c, self.routes)
            ok = self.allowed[s]
            logits = m.pointer(enc, h, self.rows, self.route, self.routes).reshape(p * r, n)
            logp = torch.log_softmax(logits.masked_fill(~ok, float("-inf")), dim=1)
            ch = self.choice[s]
            lps.append(logp.gather(1, ch.unsqueeze(1)).squeeze(1))
            ents.append(-(logp.exp() * logp.masked_fill(~ok, 0.0)).sum(1))
            lstm_in = enc.reshape(p * r, n, d).gather(
                1, ch.view(p * r, 1, 1).expand(p * r, 1, d)).squeeze(1)
            prev = enc
        lp, ent = (torch.stack(t).sum(0).reshape(p, r) for t in (lps, ents))
        pack_loss(self.work, lp, ent).backward()
        return lp.detach(), ent.detach()

    def grads(self) -> dict[str, torch.Tensor]:
        return {name: w.grad for name, w in zip(self.model.names, self.model.weights,
                                                 strict=True)}

    def clear(self) -> None:
        for w in self.model.weights:
            w.grad = None


def vmapped(base: nn.Module, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
            work: Work) -> Callable[[], Outputs]:
    """``vmap(functional_call(base, (params, buffers), args))`` over the members of ``work``
    (``base`` holds the network as ``.net``; ``tid`` is shared, not mapped)."""
    prefixed = ({"net." + k: v for k, v in params.items()},
                {"net." + k: v for k, v in buffers.items()})

    def member(ps: dict[str, torch.Tensor], bs: dict[str, torch.Tensor],
               *args: torch.Tensor) -> Outputs:
        return functional_call(base, (ps, bs), args)

    w = work
    return functools.partial(vmap(member, in_dims=(0, 0, 0, None, 0, 0, 0, 0)), *prefixed,
                             w.static, w.tid, w.dyn, w.bias, w.allowed, w.choice)


class Vmapped(Way):
    """The plain member step vmapped over ``stack_module_state`` of the P networks."""

    def __init__(self, nets: list[PointerNet], work: Work, math_attention: bool = False):
        self.params, self.buffers = stack_module_state(nets)  # leaves needing gradients
        base = PlainMember(copy.deepcopy(nets[0]).to("meta"), math_attention)
        self.call = vmapped(base, self.params, self.buffers, work)
        self.work = work

    def run(self) -> Outputs:
        lp, ent = self.call()
        pack_loss(self.work, lp, ent).backward()
        return lp.detach(), ent.detach()

    def grads(self) -> dict[str, torch.Tensor]:
        return {k: v.grad for k, v in self.params.items()}

    def clear(self) -> None:
        for v in self.params.values():
            v.grad = None


class Loop(Way):
    """Member after member, each its own network: the plain step, or (``net``) the network's
    own methods with ``fastops``' weight gradients summed in place, as ``train`` runs them."""

    def __init__(self, nets: list[PointerNet], work: Work, net: bool = False):
        self.nets = [copy.deepcopy(m).train() for m in nets]
        self.members = [NetMember(m) if net else PlainMember(m) for m in self.nets]
        self.net, self.work = net, work

    def run(self) -> Outputs:
        lps, ents = [], []
        for p, member in enumerate(self.members):
            lp, ent = member(*self.work.member(p))
            loss = reinforce_loss(self.work.reward[p], lp, ent, self.work.batch, BETA).loss
            with fastops.deferred_grads() if self.net else contextlib.nullcontext():
                loss.backward()
            lps.append(lp.detach())
            ents.append(ent.detach())
        return torch.stack(lps), torch.stack(ents)

    def grads(self) -> dict[str, torch.Tensor]:
        per = [dict(m.named_parameters()) for m in self.nets]
        return {k: torch.stack([q[k].grad for q in per]) for k in per[0]}

    def clear(self) -> None:
        for m in self.nets:
            m.zero_grad(set_to_none=True)


class Epochs(Way):
    """Training epochs of the P members (fresh RNG streams seeded as ``train`` seeds them)."""

    epoch = True

    def __init__(self, catalog: Catalog, regions: list[str], tourists: int, batch: int,
                 seed: int):
        self.configs = [TrainConfig(regions=[r], batch_size=batch, tourists_per_epoch=tourists,
                                    seed=seed + i, threads=1) for i, r in enumerate(regions)]
        self.regions = [catalog.region(r) for r in regions]
        self.rngs = [np.random.default_rng(c.seed) for c in self.configs]
        self.gens = [torch.Generator().manual_seed(c.seed) for c in self.configs]

    def tourists(self, i: int) -> Instances:
        """Member ``i``'s tourists of this epoch (its own generator)."""
        c = self.configs[i]
        return tourist_batch(self.regions[i], c.tourists_per_epoch, self.rngs[i], c,
                             torch.device("cpu"))


class StackedEpoch(Epochs):
    """One pack epoch as ``train_pack``'s step (without its callbacks and validation)."""

    def __init__(self, catalog: Catalog, regions: list[str], nets: list[PointerNet],
                 tourists: int, batch: int, seed: int):
        super().__init__(catalog, regions, tourists, batch, seed)
        p = len(nets)
        self.model = StackedPointerNet(nets).train()
        self.optimizer = StackedAdam(self.model.weights, p)
        self.ids = torch.cat([torch.arange(i * tourists, (i + 1) * tourists)
                              .repeat_interleave(batch) for i in range(p)])
        self.member = torch.arange(p).repeat_interleave(tourists)
        self.lengths: list[torch.Tensor] = []  # the sampled routes' node counts, every epoch

    def run(self) -> Outputs:
        instances = stack_instances([self.tourists(i) for i in range(len(self.configs))])
        members = range(len(self.configs))
        out, rls, _ = pack_step(self.model, self.optimizer, instances, self.ids, self.member,
                                self.gens, self.configs, members,
                                [c.learning_rate(0) for c in self.configs])
        self.lengths.append(out.lengths)
        return (torch.stack([rl.reward.reshape(-1) for rl in rls]),
                torch.stack([rl.loss.detach() for rl in rls]))


class LoopEpoch(Epochs):
    """The same epoch member after member, each its own network and Adam, as ``train`` runs
    it (``optw.train.step.reinforce_step``: compacted rollout, ``fastops``)."""

    def __init__(self, catalog: Catalog, regions: list[str], nets: list[PointerNet],
                 tourists: int, batch: int, seed: int):
        super().__init__(catalog, regions, tourists, batch, seed)
        self.nets = [copy.deepcopy(m).train() for m in nets]
        self.optimizers = [make_optimizer(m, self.configs[0].learning_rate(0))
                           for m in self.nets]
        self.ids = torch.arange(tourists).repeat_interleave(batch)

    def run(self) -> Outputs:
        rewards, losses = [], []
        for i, (net, opt, c) in enumerate(zip(self.nets, self.optimizers, self.configs,
                                               strict=True)):
            rl, _ = reinforce_step(net, opt, self.tourists(i), self.ids, self.gens[i], c,
                                   c.learning_rate(0))
            rewards.append(rl.reward.reshape(-1))
            losses.append(rl.loss.detach())
        return torch.stack(rewards), torch.stack(losses)


# --- what breaks under vmap ---------------------------------------------------------------------
class PlainLSTMCell(nn.Module):
    """``nn.LSTMCell`` in plain ops, with its parameter names (vmap has no rule for
    ``aten::lstm_cell``)."""

    def __init__(self, cell: nn.LSTMCell):
        super().__init__()
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            setattr(self, name, nn.Parameter(getattr(cell, name).detach().clone()))

    def forward(self, x: torch.Tensor, hc: tuple[torch.Tensor, torch.Tensor]) -> Outputs:
        return lstm_step(x, *hc, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)


@contextlib.contextmanager
def fastops_bypassed() -> Iterator[None]:
    """``fastops``' blocks take their plain compositions (as under ``torch.compile``), by
    patching its ``tracing`` test for the duration (the attention's own test is untouched: at
    one thread it takes PyTorch's fused kernel for these widths anyway)."""
    saved = fastops.tracing
    fastops.tracing = lambda: True
    try:
        yield
    finally:
        fastops.tracing = saved


@contextlib.contextmanager
def diagnostics() -> Iterator[list[str]]:
    """The warnings given inside the block, Python's and those PyTorch's C++ code writes to
    the standard error (kept out of this benchmark's output)."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode(errors="replace").splitlines())
            lines.extend(str(c.message) for c in caught)


def summarise(lines: list[str]) -> str:
    """The ops without a batching rule (vmap loops over the members) or autograd kernel."""
    slow = sorted({m for ln in lines for m in re.findall(r"batching rule for (\S+?)\.? Please",
                                                           ln)})
    no_grad = sorted({m for ln in lines for m in re.findall(
        r"(\S+): an autograd kernel was not registered", ln)})
    out = []
    if slow:
        out.append("no batching rule, looped: " + ", ".join(slow))
    if no_grad:
        out.append("no autograd kernel (gradient dropped): " + ", ".join(no_grad))
    return "; ".join(out)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


def probe_vmap(nets: list[PointerNet], work: Work) -> list[tuple[str, str]]:
    """What happens when ``PointerNet`` itself, ``fastops`` and the compacted decoder's kind of
    op are vmapped: (what, outcome) pairs; gradients checked against member-by-member ones."""
    refs = [copy.deepcopy(m) for m in nets]
    for p, m in enumerate(refs):
        lp, ent = net_decode(m, *work.member(p))
        (lp.sum() + ent.sum()).backward()
    ref_g = {k: torch.stack([dict(m.named_parameters())[k].grad for m in refs])
             for k, _ in refs[0].named_parameters()}
    out: list[tuple[str, str]] = []

    def attempt(what: str, swap_lstm: bool, bypass: bool) -> None:
        params, buffers = stack_module_state(nets)
        base = NetMember(copy.deepcopy(nets[0]).to("meta"))
        if swap_lstm:
            base.net.lstm = PlainLSTMCell(base.net.lstm)
        try:
            with diagnostics() as lines, (fastops_bypassed() if bypass
                                          else contextlib.nullcontext()):
                lp, ent = vmapped(base, params, buffers, work)()
                (lp.sum() + ent.sum()).backward()
        except Exception as exc:  # noqa: BLE001 - what breaks is the finding
            out.append((what, "FAILS: " + _first_line(exc)))
            return
        missing = [k for k, v in params.items() if v.grad is None]
        have = {k: v.grad for k, v in params.items() if v.grad is not None}
        diff = max_diff(have, {k: ref_g[k] for k in have}) if have else float("nan")
        named = f" ({', '.join(have)})" if len(have) <= 3 else ""
        verdict = (f"runs; {len(missing)} of {len(params)} weights get no gradient, the others"
                   f"{named} differ by {diff:.0e}" if missing or diff > 1e-3
                   else f"runs, gradients right ({diff:.0e})")
        note = summarise(lines)
        out.append((what, verdict + (f"; {note}" if note else "")))

    attempt("PointerNet as is (forward + backward)", False, False)
    attempt("... its LSTMCell swapped for plain ops", True, False)
    attempt("... and fastops' fast paths bypassed", True, True)
    x, w = work.dyn[0, 0], torch.randn(2, 16, 8, requires_grad=True)
    mask = work.allowed[:, 0]
    found: list[bool] = []

    def probe_onednn(x: torch.Tensor) -> torch.Tensor:
        found.append(fastops.onednn.__wrapped__())  # the probe itself, not its cached value
        return x

    for what, f, args in (
            ("a fastops autograd.Function (_Linear) under vmap",
             lambda x, w: fastops._Linear.apply(x, w, None, "none", None),
             (x.expand(2, -1, -1), w)),
            ("fastops.onednn()'s probe, run inside vmap", probe_onednn, (x.expand(2, -1, -1),)),
            ("the compacted decoder's rows: mask.nonzero()", lambda m: m.nonzero(), (mask,)),
            ("its sizes: int(count.max())", lambda m: torch.zeros(int(m.sum(-1).max())),
             (mask,))):
        try:
            with diagnostics():
                vmap(f)(*args)
            out.append((what, f"says {found[-1]} (outside: {fastops.onednn()})" if found
                        and f is probe_onednn else "runs"))
        except Exception as exc:  # noqa: BLE001
            out.append((what, "FAILS: " + _first_line(exc)))
    return out


# --- checks and timing --------------------------------------------------------------------------
def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest |a - b| over the tensors, each relative to its largest |b|."""
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp(min=1e-12)) for k in b)


def check_plain(net: PointerNet, work: Work) -> str:
    """Member 0: the plain step against ``PointerNet``'s own methods (outputs, gradients)."""
    a, b = (copy.deepcopy(net).train() for _ in range(2))
    lp_a, ent_a = PlainMember(a)(*work.member(0))
    lp_b, ent_b = net_decode(b, *work.member(0))
    for lp, ent in ((lp_a, ent_a), (lp_b, ent_b)):
        with fastops.deferred_grads():
            reinforce_loss(work.reward[0], lp, ent, work.batch, BETA).loss.backward()
    lp_a, ent_a, lp_b, ent_b = (t.detach() for t in (lp_a, ent_a, lp_b, ent_b))
    g_a = {k: v.grad for k, v in a.named_parameters()}
    g_b = {k: v.grad for k, v in b.named_parameters()}
    return (f"plain member step vs PointerNet (member 0, {work.tid.shape[0]} routes, "
            f"{work.choice.shape[1]} steps): max |d log p| {float((lp_a - lp_b).abs().max()):.1e}"
            f" (|log p| up to {float(lp_b.abs().max()):.1f}), max |d entropy| "
            f"{float((ent_a - ent_b).abs().max()):.1e}, gradients {max_diff(g_a, g_b):.1e} "
            "(relative)")


def agreement(name: str, ways: dict[str, Way], outs: dict[str, Outputs]) -> str:
    """``name``'s outputs and gradients against its :data:`CHECK_AGAINST` way's."""
    ref = CHECK_AGAINST.get(name)
    if ref not in ways:
        return "reference" if name in CHECK_AGAINST.values() else "-"
    (a0, a1), (b0, b1) = outs[name], outs[ref]
    if ways[name].epoch:
        return (f"vs {ref}: rewards {float((a0 - b0).abs().max()):.0e}, losses "
                f"{float((a1 - b1).abs().max()):.0e}")
    g, ref_g = ways[name].grads(), ways[ref].grads()
    grads = f", grads {max_diff(g, ref_g):.0e}" if g is not None and ref_g is not None else ""
    return f"vs {ref}: log p {float((a0 - b0).abs().max()):.0e}{grads}"


def make_way(name: str, catalog: Catalog, regions: list[str], nets: list[PointerNet],
             work: Work | None, args: argparse.Namespace) -> Way:
    """The way ``name`` for the pack of ``nets`` (dense ways: on ``work``)."""
    if name in EPOCH_WAYS:
        kind = StackedEpoch if name == "stacked-epoch" else LoopEpoch
        return kind(catalog, regions, nets, args.tourists, args.batch, args.seed)
    assert work is not None
    if name == "stacked":
        return StackedDense(nets, work)
    if name in ("vmap", "vmap-math"):
        return Vmapped(nets, work, math_attention=name == "vmap-math")
    return Loop(nets, work, net=name == "loop-net")


def call(way: Way, times: int = 1) -> tuple[float, float, Outputs]:
    """Wall and CPU seconds (this process) per call of ``way.run`` over ``times`` calls
    (gradients dropped before each)."""
    wall = cpu = 0.0
    for _ in range(times):
        way.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        out = way.run()
        wall += time.perf_counter() - t0
        cpu += time.process_time() - c0
    return wall / times, cpu / times, out


def available_memory() -> int | None:
    """Bytes of memory available to new work (Linux), or None."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def bench_pack(catalog: Catalog, size: int, args: argparse.Namespace, ways: list[str],
               ) -> list[dict]:
    """Every way for a pack of ``size`` members, interleaved over ``args.repeats`` rounds
    (none where the dense decodes' backward would take most of the available memory)."""
    dense = [w for w in ways if w not in EPOCH_WAYS]
    need = size * (args.steps + 1) * args.tourists * args.batch * 102 * ROW_PASS_BYTES
    free = available_memory()
    if dense and free is not None and need > args.memory_share * free:
        print(f"P = {size}: skipped, its dense decodes would keep about {need / 2**30:.1f} GiB "
              f"for the backward, of {free / 2**30:.1f} GiB available (fewer --steps, or a "
              "larger --memory-share?)")
        return []
    regions = REGIONS[:size]
    nets = []
    for i in range(size):
        torch.manual_seed(args.seed + i)  # a fresh pack member, seeded as train_pack seeds it
        nets.append(PointerNet(ModelConfig()).train())
    work = warm = None
    if dense:
        work = make_work(catalog, regions, nets, args.tourists, args.batch, args.steps,
                         args.seed)
        warm = make_work(catalog, regions, nets, args.tourists, args.batch, 1, args.seed)
    made = {name: make_way(name, catalog, regions, nets, work, args) for name in ways}
    outs = {}
    for name, way in made.items():  # warm-up: kernels, caches (the dense ways on one step)
        if way.epoch:
            outs[name] = call(way)[2]  # the first epochs of the same seeds: checked
        else:
            call(make_way(name, catalog, regions, nets, warm, args))
    walls: dict[str, list[float]] = {name: [] for name in made}
    cpus: dict[str, list[float]] = {name: [] for name in made}
    for i in range(args.repeats):
        for name, way in made.items():
            wall, cpu, out = call(way, args.epochs if way.epoch else 1)
            walls[name].append(wall)
            cpus[name].append(cpu)
            if i == 0 and not way.epoch:
                outs[name] = out
    notes = []
    if work is not None:
        lengths = work.lengths.float()
        notes.append(f"dense decode of {args.steps} steps (its routes: "
                     f"{float(lengths.mean()):.1f} nodes, max {int(lengths.max())})")
    epoch = next((w for w in made.values() if isinstance(w, StackedEpoch)), None)
    if epoch is not None:
        ep = torch.cat(epoch.lengths).float()
        notes.append(f"the real epochs' routes: {float(ep.mean()):.1f} nodes, max "
                     f"{int(ep.max())}")
    print(f"P = {size}: " + "; ".join(notes), flush=True)
    passes = size * (args.steps + 1)
    return [{"way": name, "P": size, "passes": None if made[name].epoch else passes,
             "wall": statistics.median(walls[name]),
             "cpu": statistics.median(cpus[name]), "cpus": cpus[name],
             "agree": agreement(name, made, outs)} for name in made]


def print_table(rows: list[dict]) -> None:
    """Medians of wall and CPU seconds per call; ratios of the CPU medians."""
    cpu = {(r["way"], r["P"]): r["cpu"] for r in rows}
    print(f"\n{'way':<14} {'P':>3} {'wall s':>8} {'CPU s':>8} {'CPU min':>8} {'ms/pass':>8} "
          f"{'ratio':>6} {'x epoch':>8}  agreement (max |difference|; gradients relative)")
    for r in rows:
        ref = cpu.get((RATIO_TO.get(r["way"], "stacked"), r["P"]))
        ep = cpu.get(("stacked-epoch", r["P"]))
        ratio = f"{r['cpu'] / ref:.2f}" if ref else "-"
        x_ep = f"{r['cpu'] / ep:.1f}" if ep and r["way"] not in RATIO_TO else "-"
        per = f"{1e3 * r['cpu'] / r['passes']:.1f}" if r["passes"] else "-"
        print(f"{r['way']:<14} {r['P']:>3} {r['wall']:>8.3f} {r['cpu']:>8.3f} "
              f"{min(r['cpus']):>8.3f} {per:>8} {ratio:>6} {x_ep:>8}  {r['agree']}")
    print("Medians over the rounds, per call: one dense decode's forward + backward, or one "
          "epoch.\nms/pass: CPU ms per member and pass (the first + T steps); ratio: CPU time "
          "to stacked (dense\ndecodes) or to stacked-epoch (epochs); x epoch: a dense decode's "
          "CPU time in stacked epochs.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--packs", default="4,8,14", help="pack sizes P, comma-separated")
    p.add_argument("--steps", type=int, default=6,
                   help="dense decoding steps T (memory: P = 14, T = 6 keep about 4 GB)")
    p.add_argument("--tourists", type=int, default=1, help="tourists per member (K)")
    p.add_argument("--batch", type=int, default=16, help="routes per tourist (B)")
    p.add_argument("--repeats", type=int, default=4, help="interleaved timing rounds")
    p.add_argument("--epochs", type=int, default=3, help="epochs per round (epoch ways)")
    p.add_argument("--ways", default=",".join(DEFAULT_WAYS), help=f"of {', '.join(WAYS)}")
    p.add_argument("--seed", type=int, default=100, help="member i's seed: seed + i")
    p.add_argument("--memory-share", type=float, default=MEMORY_SHARE,
                   help="largest share of the available memory a pack's dense decodes may "
                   "keep (estimated; the peak is about 1.5 times that)")
    p.add_argument("--no-probe", action="store_true", help="skip the vmap probes")
    p.add_argument("--quick", action="store_true",
                   help="about a minute: P = 4 and 8, 4 steps, 2 rounds")
    p.add_argument("--catalog", type=Path, default=None, help="built catalog folder")
    args = p.parse_args(argv)
    if args.quick:
        args.packs, args.steps, args.repeats = "4,8", 4, 2
    sizes = [int(s) for s in args.packs.split(",")]
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    bad = [w for w in ways if w not in WAYS] + [s for s in sizes if not 1 <= s <= len(REGIONS)]
    if bad or min(args.steps, args.tourists, args.batch, args.repeats, args.epochs) < 1:
        p.error(f"unknown ways or pack sizes {bad} (ways: {WAYS}; P in 1..{len(REGIONS)}), "
                "or a count below 1")
    torch.set_num_threads(1)
    fastops.onednn()  # probed here, outside vmap (a probe inside one fails, and is cached)
    catalog = open_catalog(args.catalog) if args.catalog else open_catalog()
    t_start = time.perf_counter()
    print(f"bench_vmap: torch {torch.__version__}, 1 thread, "
          f"{torch.backends.cpu.get_cpu_capability()}, oneDNN {fastops.train_onednn()}; "
          f"ModelConfig() (d 128, 8 heads, 2 layers, d_ff 256); K = {args.tourists} tourist(s) "
          f"x B = {args.batch} routes per member; n = 102 nodes")
    nets = []
    for i in range(2):
        torch.manual_seed(args.seed + i)
        nets.append(PointerNet(ModelConfig()).train())
    print(check_plain(nets[0], make_work(catalog, REGIONS[:1], nets[:1], 1, 8, args.steps,
                                         args.seed)))
    if not args.no_probe:
        print("vmap over 2 members (4 routes, 3 steps), gradients against member by member:")
        small = make_work(catalog, REGIONS[:2], nets, 1, 4, 3, args.seed)
        for what, outcome in probe_vmap(nets, small):
            print(f"  {what:<50} {outcome}")
    # said once above (the probes): vmap loops over the members for these ops
    warnings.filterwarnings("ignore", message="There is a performance drop")
    rows = []
    for size in sizes:
        rows += bench_pack(catalog, size, args, ways)
    print_table(rows)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"total {time.perf_counter() - t_start:.0f} s, peak memory {peak:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
