"""Step-by-step decoding with the pointer network, and the training rollout.

Its speed-ups (docs/model.md, "Speed-up techniques": active-node compaction, shared prefixes,
forced routes leaving the batch, no copies, attention buckets) are all exact: the same outputs
as evaluating every node at every step.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from optw.allocator import reuse_large_blocks
from optw.env.instances import Instances
from optw.env.state import Features, State, adjacency, reset, visit, visit_end
from optw.model.network import Bucket, Layout, PointerNet, graph_bias
from optw.model.stacked import Groups, StackedPointerNet


def rows_of(count: torch.Tensor, parent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed rows of the routes ``parent[C]`` (routes may repeat), for row counts ``count[R]``:
    (source row of each new row, new route index of each new row), new rows grouped by route."""
    c_count = count.index_select(0, parent)
    total = int(c_count.sum())
    child = torch.repeat_interleave(torch.arange(parent.shape[0], device=count.device),
                                    c_count, output_size=total)
    offset = (torch.cumsum(count, 0) - count).index_select(0, parent) - (
        torch.cumsum(c_count, 0) - c_count)  # source start - new start
    return torch.arange(total, device=count.device) + offset.index_select(0, child), child


def padded_rows(n: int) -> int:
    """``n`` rounded up on a grid of 8 sizes per octave (<= 12.5% padding): the linear layers
    see few shapes (oneDNN compiles one kernel per shape)."""
    if n <= 64:
        return max(16, -(-n // 16) * 16)
    q = 1 << (n.bit_length() - 4)
    return -(-n // q) * q


def with_padding(index: torch.Tensor) -> torch.Tensor:
    """``index[N]`` extended to :func:`padded_rows` entries (extra entries repeat the first)."""
    n = index.shape[0]
    extra = padded_rows(n) - n
    if extra == 0 or n == 0:
        return index
    return torch.cat([index, index[:1].expand(extra)])


@dataclass
class Frontier:
    """Live routes between two decoding steps, their admissible nodes as packed rows grouped
    by route (``route[N]``, ``count[R]`` per route, ``node[N]`` ascending). The recursion input
    is the previous pass's output ``prev``, row ``src[i]`` for row i (never copied); ``(h, c)``
    the LSTM state and ``lstm_in`` its next input."""

    state: State
    node: torch.Tensor
    route: torch.Tensor
    count: torch.Tensor
    prev: torch.Tensor
    src: torch.Tensor
    h: torch.Tensor
    c: torch.Tensor
    lstm_in: torch.Tensor

    def offsets(self) -> torch.Tensor:
        """First row of each route."""
        return torch.cumsum(self.count, 0) - self.count

    def forced(self) -> torch.Tensor:
        """[R] bool: routes whose only admissible node is the end."""
        return self.state.mask.sum(1) == 1

    def index(self, idx: torch.Tensor) -> Frontier:
        """The routes ``idx`` (an index tensor)."""
        rows, child = rows_of(self.count, idx)
        return Frontier(
            self.state.index(idx), self.node.index_select(0, rows), child,
            self.count.index_select(0, idx), self.prev, self.src.index_select(0, rows),
            self.h.index_select(0, idx), self.c.index_select(0, idx),
            self.lstm_in.index_select(0, idx),
        )


@dataclass
class Pass:
    """A frontier's network pass: ``enc[i]`` of frontier row i (then padding rows), the new LSTM
    state [R, d] and logits [R, m] by route and row number (``-inf``: no row)."""

    enc: torch.Tensor
    h: torch.Tensor
    c: torch.Tensor
    logits: torch.Tensor


#: Padded attention lengths are multiples of this (much faster in PyTorch's CPU kernel).
ATTENTION_BLOCK = 16
#: Cost model for grouping routes into attention buckets (microseconds): one padded row
#: (gathers), one attention entry (both layers, all heads), one more bucket.
_ROW_COST, _ENTRY_COST, _BUCKET_COST = 0.3, 0.035, 150.0
MAX_BUCKETS = 6


def plan_buckets(counts: list[int]) -> list[tuple[int, int]]:
    """Group routes sorted by decreasing row count into buckets (number of routes, width
    rounded up to :data:`ATTENTION_BLOCK`); a group joins the previous bucket when its padding
    costs less than a new bucket."""
    widths = (-(-max(c, 1) // ATTENTION_BLOCK) * ATTENTION_BLOCK for c in counts)
    buckets: list[list[int]] = []  # [width, routes]
    for w, same in itertools.groupby(widths):
        g = len(list(same))
        if buckets:
            big = buckets[-1][0]
            waste = g * ((big - w) * _ROW_COST + (big * big - w * w) * _ENTRY_COST)
            if waste < _BUCKET_COST or len(buckets) == MAX_BUCKETS:
                buckets[-1][1] += g
                continue
        buckets.append([w, g])
    return [(g, w) for w, g in buckets]


class Decoder:
    """Runs the model over routes of ``inst``; its states carry only ids, node, time and mask
    (no ``visited``, ``done`` or ``route``: :func:`~optw.env.state.visit`)."""

    def __init__(self, model: PointerNet, inst: Instances):
        reuse_large_blocks()  # large tables at every step: keep freed blocks (optw.allocator)
        self.model = model
        self.inst = inst
        self.n = inst.n_nodes
        self.end = inst.n_nodes - 1
        emb = self._embed_static()  # [K, n, d/2], shared by all routes
        self.static_emb = emb.reshape(-1, emb.shape[-1])
        self.feat = Features(inst)
        self._latest = inst.node_u[..., 3].contiguous()  # [K, n]
        # every layer's key weight, concatenated once per rollout (not once per pass)
        self.key_weight = (model.key_weight() if isinstance(model, PointerNet)
                           and model.cfg.recursion else None)

    def child_state(self, state: State, parent: torch.Tensor, action: torch.Tensor) -> State:
        """The routes ``parent`` moved to ``action`` (never the end)."""
        ids = state.ids.index_select(0, parent)
        time_u, mask = visit(self.inst, ids, state.current.index_select(0, parent),
                             state.time_u.index_select(0, parent),
                             state.mask.index_select(0, parent), action, self._latest)
        return State(ids, action, time_u, None, mask, None, None)

    def inputs(self, state: State, node: torch.Tensor,
               route: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows' tourists [N], static embeddings [N, d/2] and dynamic features [N, 8]."""
        ids, cur, t = self.state_rows(state, route)
        flat = ids * self.n + node
        travel = self.inst.dist_u.view(-1).take((ids * self.n + cur) * self.n + node)
        return ids, self.static_emb.index_select(0, flat), self.feat.rows(ids, flat, t, travel)

    def _embed_static(self) -> torch.Tensor:
        return self.model.embed_static(self.inst.static)

    @staticmethod
    def _logit_table(logits: torch.Tensor, route: torch.Tensor,
                     count: torch.Tensor) -> torch.Tensor:
        """Packed row logits ``[N]`` -> ``[R, m]`` by route and row number (``-inf`` elsewhere)."""
        r, m = count.shape[0], int(count.max())
        rownum = torch.arange(route.shape[0], device=route.device) - (
            torch.cumsum(count, 0) - count).index_select(0, route)
        table = torch.full((r * m,), float("-inf"), device=logits.device)
        return table.index_put((route * m + rownum,), logits).view(r, m)

    def _admissible(self, state: State, node: torch.Tensor, route: torch.Tensor) -> torch.Tensor:
        """Whether each row's node is admissible in its route's ``state``."""
        return state.mask.view(-1).index_select(0, route * self.n + node)

    @staticmethod
    def state_rows(state: State, route: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(ids, current, time_u) of each row's route."""
        return tuple(t.index_select(0, route) for t in (state.ids, state.current, state.time_u))

    def _layout(self, state: State, node: torch.Tensor, route: torch.Tensor,
                count: torch.Tensor) -> Layout:
        """Attention buckets for the packed rows, with the graph Ad of each as the bias."""
        dev = node.device
        offsets = torch.cumsum(count, 0) - count
        order = torch.argsort(count, descending=True, stable=True)
        plan = plan_buckets(count.index_select(0, order).tolist())
        widths = [w for g, w in plan for _ in range(g)]  # per route, in sorted order
        total = sum(widths)
        host = torch.tensor([widths, [0, *itertools.accumulate(widths)][:-1]], dtype=count.dtype)
        if dev.type == "cuda":  # pinned: a copy from pageable memory waits for queued kernels
            host = host.pin_memory().to(dev, non_blocking=True)
        width, sorted_start = host.unbind(0)
        row_start = torch.empty_like(width).index_copy_(0, order, sorted_start)
        att_route = torch.repeat_interleave(order, width, output_size=total)
        slot = torch.arange(total, device=dev) - row_start.index_select(0, att_route)
        cnt = count.index_select(0, att_route)
        gather = offsets.index_select(0, att_route) + torch.minimum(slot, cnt - 1)
        back = row_start.index_select(0, route) + torch.arange(node.shape[0], device=dev) - (
            offsets.index_select(0, route))
        att_node = node.index_select(0, gather)
        valid = slot < cnt
        # each bucket's graph Ad (its row-wise parts computed once for all padded rows)
        buckets, start = [], 0
        lookahead = self.model.cfg.graph == "lookahead"
        if lookahead:
            inst, n = self.inst, self.n
            ids, cur, t = self.state_rows(state, att_route)
            base = ids * n
            table = inst.node_u.view(-1, 4).index_select(0, base + att_node)  # [T, 4]
            arrival = t + inst.dist_u.view(-1).take((base + cur) * n + att_node)
            leave = visit_end(arrival, table[:, 0], table[:, 2])
            latest, row_key, dist = table[:, 3], (base + att_node) * n, inst.dist_u.view(-1)
        for g, w in plan:
            rows = slice(start, start + g * w)
            columns = valid[rows].view(g, w)
            if lookahead:
                sub = dist.take(row_key[rows].view(g, w, 1) + att_node[rows].view(g, 1, w))
                adj = adjacency(columns, leave[rows].view(g, w), sub, latest[rows].view(g, w))
            else:
                adj = adjacency(columns)
            buckets.append(Bucket(g, w, graph_bias(adj)))
            start += g * w
        # padding rows (copies of row 0) go through the row-wise blocks only
        return Layout(with_padding(route), gather, with_padding(back), buckets)

    def _pass(self, state: State, node: torch.Tensor, route: torch.Tensor, count: torch.Tensor,
              fr: Frontier | None) -> Pass:
        """Encoder pass over the packed rows ``node``/``route`` (``count[R]`` per route), with
        ``fr``'s recursion input, LSTM step and pointer (without ``fr``: encodings only)."""
        layout = self._layout(state, node, route, count)
        _, static, dynamic = self.inputs(state, with_padding(node), layout.route)
        x = self.model.embed(static, dynamic)
        if fr is None:
            return Pass(self.model.encode(x, x, layout, key_weight=self.key_weight),
                        None, None, None)  # type: ignore
        enc = self.model.encode(x, fr.prev, layout, fr.src, self.key_weight)
        h, c = self.model.lstm(fr.lstm_in, (fr.h, fr.c))
        logits = self.model.pointer(enc, h, layout.route)[:node.shape[0]]
        return Pass(enc, h, c, self._logit_table(logits, route, count))

    # --- the decoding sequence -----------------------------------------------------------------
    def start(self, ids: torch.Tensor) -> Frontier:
        """Steps 1-2 of the spec: a first pass with the start admissible, then it is visited."""
        s0 = reset(self.inst, ids)
        r = s0.n_routes
        route, node = s0.mask.nonzero(as_tuple=True)
        count = s0.mask.sum(1)
        e0 = self._pass(s0, node, route, count, None).enc
        lstm_in = e0.index_select(0, torch.cumsum(count, 0) - count)  # node 0 leads each route
        first = torch.arange(r, device=ids.device)
        s1 = self.child_state(s0, first, torch.zeros_like(first))
        keep = self._admissible(s1, node, route).nonzero().squeeze(1)
        route = route.index_select(0, keep)
        return Frontier(s1, node.index_select(0, keep), route, torch.bincount(route, minlength=r),
                        e0, keep, *self._initial_state(s0), lstm_in)

    def _initial_state(self, s0: State) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.initial_state(s0.n_routes)

    def evaluate(self, fr: Frontier) -> Pass:
        """One encoder pass, LSTM step and pointer over the frontier's rows."""
        return self._pass(fr.state, fr.node, fr.route, fr.count, fr)

    def advance(self, fr: Frontier, p: Pass, parent: torch.Tensor, slot: torch.Tensor) -> Frontier:
        """Children of routes ``parent[C]`` (evaluated as ``p``) moving to their parent's row
        ``slot[C]`` (never the end node)."""
        chosen = fr.offsets().index_select(0, parent) + slot
        action = fr.node.index_select(0, chosen)
        state = self.child_state(fr.state, parent, action)
        src, child = rows_of(fr.count, parent)
        node = fr.node.index_select(0, src)
        keep = self._admissible(state, node, child).nonzero().squeeze(1)
        src, child = src.index_select(0, keep), child.index_select(0, keep)
        return Frontier(
            state, node.index_select(0, keep), child,
            torch.bincount(child, minlength=parent.shape[0]),
            p.enc, src, p.h.index_select(0, parent), p.c.index_select(0, parent),
            p.enc.index_select(0, chosen),
        )


class StackedDecoder(Decoder):
    """:class:`Decoder` for a :class:`~optw.model.StackedPointerNet`: ``member[K]`` is each
    tourist's member; a pass evaluates all members' routes at once."""

    def __init__(self, model: StackedPointerNet, inst: Instances, member: torch.Tensor):
        if member.shape != (inst.n_tourists,):
            raise ValueError(f"member has shape {tuple(member.shape)}, expected one entry per "
                             f"tourist ({inst.n_tourists})")
        self.member = member.to(device=inst.device, dtype=torch.long)
        self.p = model.n_members
        super().__init__(model, inst)  # type: ignore[arg-type]

    def _embed_static(self) -> torch.Tensor:
        return self.model.embed_static(self.inst.static, self.member)

    def _initial_state(self, s0: State) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.initial_state(self.member.index_select(0, s0.ids))

    def _pass(self, state: State, node: torch.Tensor, route: torch.Tensor, count: torch.Tensor,
              fr: Frontier | None) -> Pass:
        model: StackedPointerNet = self.model  # type: ignore[assignment]
        layout = self._layout(state, node, route, count)
        ids, static, dynamic = self.inputs(state, node, route)
        rows = Groups.of(self.member.index_select(0, ids), self.p)
        x = model.embed(static, dynamic, rows)
        if fr is None:
            return Pass(model.encode(x, x, layout, rows), None, None, None)  # type: ignore
        enc = model.encode(x, fr.prev, layout, rows, fr.src)
        routes = Groups.of(self.member.index_select(0, state.ids), self.p)
        h, c = model.lstm(fr.lstm_in, fr.h, fr.c, routes)
        logits = model.pointer(enc, h, rows, route, routes)
        return Pass(enc, h, c, self._logit_table(logits, route, count))


def _sample_members(probs: torch.Tensor, owner: torch.Tensor, fr: Frontier,
                    member: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """One draw per live route from ``probs`` (rows in member order), each member from its own
    generator and over its own table width: exactly the draws the member's model makes alone."""
    state_member = member.index_select(0, fr.state.ids)
    live_member = state_member.index_select(0, owner)
    slot = torch.empty(owner.shape[0], dtype=torch.long, device=probs.device)
    counts = torch.bincount(live_member, minlength=len(generators)).tolist()
    widths = torch.zeros(len(generators), dtype=fr.count.dtype, device=fr.count.device)
    widths = widths.scatter_reduce(0, state_member, fr.count, "amax").tolist()
    start = 0
    for p, c in enumerate(counts):
        if c:
            slot[start:start + c] = torch.multinomial(probs[start:start + c, :widths[p]], 1,
                                                      generator=generators[p]).squeeze(1)
            start += c
    return slot


@dataclass
class Rollout:
    """Routes built by :func:`rollout`: ``routes[R, L]`` from 0 to the end ``n-1``, padded with
    -1; ``reward``: sum of scores; ``log_prob`` and ``entropy``: summed over the route's step
    policies (differentiable; forced last steps contribute 0); ``lengths``: nodes per route."""

    routes: torch.Tensor
    reward: torch.Tensor
    log_prob: torch.Tensor
    entropy: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def of(cls, instances: Instances, ids: torch.Tensor, routes: torch.Tensor,
           log_prob: torch.Tensor, entropy: torch.Tensor) -> Rollout:
        """The rollout of ``routes`` (padded with -1), trimmed to the longest route."""
        lengths = (routes >= 0).sum(1)
        routes = routes[:, : int(lengths.max())]
        return cls(routes, route_reward(instances, ids, routes), log_prob, entropy, lengths)


class ForcedActionError(ValueError):
    """A given (teacher-forced) action that is not admissible (``route``: an index of ids)."""

    def __init__(self, route: int, step: int, node: int):
        super().__init__(f"route {route}: node {node} at step {step} is not admissible")
        self.route, self.step, self.node = route, step, node


def _forced_slots(fr: Frontier, owner: torch.Tensor, live: torch.Tensor, want: torch.Tensor,
                  step: int) -> torch.Tensor:
    """The row numbers of the nodes ``want`` [L] in their frontier routes ``owner`` [L];
    :class:`ForcedActionError` for one that is not admissible there."""
    mask = fr.state.mask.index_select(0, owner)
    col = want.clamp(0, mask.shape[1] - 1).unsqueeze(1)
    ok = (want >= 0) & mask.gather(1, col).squeeze(1)
    if not bool(ok.all()):
        i = int((~ok).nonzero()[0, 0])
        raise ForcedActionError(int(live[i]), step, int(want[i]))
    return (mask.cumsum(1).gather(1, col).squeeze(1) - 1)


class Greedy:
    """A rollout's choice: each route's most likely next node."""

    def finished(self, done: torch.Tensor, live: torch.Tensor, col: int) -> None:
        """Routes ``done`` (of ``live``) end at step ``col``: nothing to check."""

    def pick(self, logits: torch.Tensor, prob: torch.Tensor, owner: torch.Tensor,
             fr: Frontier, live: torch.Tensor, col: int) -> torch.Tensor:
        """Each live route's next slot (row of its state's table ``logits[owner]``)."""
        return logits.argmax(1).index_select(0, owner)


class Sampled(Greedy):
    """A rollout's choice: each route's next node drawn from the policy with ``generator`` (a
    pack's: one generator per member, each drawing what its member's model draws alone)."""

    def __init__(self, generator: torch.Generator | list[torch.Generator] | None,
                 member: torch.Tensor | None = None):
        self.generator, self.member = generator, member

    def pick(self, logits: torch.Tensor, prob: torch.Tensor, owner: torch.Tensor,
             fr: Frontier, live: torch.Tensor, col: int) -> torch.Tensor:
        with torch.no_grad():
            probs = prob.detach().index_select(0, owner)
            if self.member is not None:
                return _sample_members(probs, owner, fr, self.member, list(self.generator))
            return torch.multinomial(probs, 1, generator=self.generator).squeeze(1)


class Forced(Greedy):
    """A rollout's choice (teacher forcing): route r follows ``actions[r]`` (0, its nodes, the
    end, padded with -1); a row of -1 is chosen by ``draw`` (drawn first for every route, so
    its random stream is the one it has without forcing)."""

    def __init__(self, actions: torch.Tensor, end: int, draw: Greedy | None):
        self.actions, self.end, self.draw = actions, end, draw

    def finished(self, done: torch.Tensor, live: torch.Tensor, col: int) -> None:
        """A given route that does not end at step ``col`` where its state must: an error."""
        if col < self.actions.shape[1]:
            rows = self.actions.index_select(0, live)
            bad = done & (rows[:, 0] >= 0) & (rows[:, col] != self.end)
            if bool(bad.any()):
                i = int(bad.nonzero()[0, 0])
                raise ForcedActionError(int(live[i]), col, int(self.actions[live[i], col]))

    def pick(self, logits: torch.Tensor, prob: torch.Tensor, owner: torch.Tensor,
             fr: Frontier, live: torch.Tensor, col: int) -> torch.Tensor:
        rows = self.actions.index_select(0, live)
        given = (rows[:, 0] >= 0).nonzero().squeeze(1)
        want = rows[given, col] if col < self.actions.shape[1] else torch.full_like(given, -1)
        slot = _forced_slots(fr, owner.index_select(0, given), live.index_select(0, given),
                             want, col)
        if self.draw is None:
            return slot
        return self.draw.pick(logits, prob, owner, fr, live, col).index_copy(0, given, slot)


def rollout(model: PointerNet, instances: Instances, ids: torch.Tensor | None = None,
            greedy: bool = False,
            generator: torch.Generator | list[torch.Generator] | None = None,
            member: torch.Tensor | None = None, actions: torch.Tensor | None = None) -> Rollout:
    """One route per entry of ``ids`` (each route's tourist; default one per tourist), sampled
    from the policy (or greedily), with the autograd graph when grad is enabled.
    ``actions`` [R, L] (teacher forcing): route r follows ``actions[r]`` (0, its nodes, the end,
    padded with -1; a row of -1 is drawn as usual), its ``log_prob`` the policy's
    log-likelihood of it; an inadmissible action raises :class:`ForcedActionError`.
    A pack (``model`` a :class:`~optw.model.StackedPointerNet`): ``member[K]`` is each tourist's
    member (in ascending order) and ``generator`` a list of one generator per member: each
    member samples exactly what its own model would alone.
    """
    dev = instances.device
    if ids is None:
        ids = torch.arange(instances.n_tourists, device=dev)
    ids = ids.to(device=dev, dtype=torch.long)
    drawing = True
    if actions is not None:
        actions = actions.to(device=dev, dtype=torch.long)
        if actions.shape[0] != ids.shape[0]:
            raise ValueError("actions: one route per entry of ids, on the compacted decoder")
        given = actions[:, 0] >= 0  # the others are drawn
        drawing = not bool(given.all())
        if not bool(given.any()):
            actions = None
    stacked = isinstance(model, StackedPointerNet)
    if stacked:
        if member is None or not (isinstance(generator, (list, tuple)) or greedy
                                  or not drawing):
            raise ValueError("a pack's rollout needs member (per tourist) and a list of "
                             "generators (one per member)")
        dec: Decoder = StackedDecoder(model, instances, member)
        if not bool((member[1:] >= member[:-1]).all()):
            raise ValueError("a pack's tourists must be grouped by member in ascending order")
        if not bool((ids[1:] >= ids[:-1]).all()):
            raise ValueError("a pack's routes must be in tourist order")
    else:
        dec = Decoder(model, instances)
    choice: Greedy = Greedy() if greedy else Sampled(generator, dec.member if stacked else None)
    if actions is not None:
        choice = Forced(actions, dec.end, choice if drawing or greedy else None)
    return walk(dec, instances, ids, choice)


def walk(dec: Decoder, instances: Instances, ids: torch.Tensor, choice: Greedy) -> Rollout:
    """The routes of :func:`rollout`, step by step: the live routes' distinct states are
    decoded once each, ``choice`` picks every live route's next node, finished routes leave."""
    dev, n, end = instances.device, dec.n, dec.end
    r = ids.shape[0]
    routes = torch.full((r, n + 1), -1, dtype=torch.long, device=dev)
    routes[:, 0] = 0
    steps_idx, steps_lp, steps_ent = [], [], []  # per step: live routes, log-probs, entropies
    first, owner = torch.unique(ids, return_inverse=True)  # one state per tourist
    fr = dec.start(first)  # the distinct states; live route i is in state owner[i]
    live = torch.arange(r, device=dev)
    col = 1
    while live.numel():
        forced = fr.forced()
        if bool(forced.any()):  # states whose only move is the end: their routes end
            done = forced.index_select(0, owner)
            choice.finished(done, live, col)
            routes[live[done], col] = end
            renumber = torch.cumsum((~forced).long(), 0) - 1
            live, owner = live[~done], renumber.index_select(0, owner[~done])
            if not live.numel():
                break
            fr = fr.index((~forced).nonzero().squeeze(1))
        p = dec.evaluate(fr)
        logp = torch.log_softmax(p.logits, dim=1)
        prob = logp.exp()  # one exp for the draw and the entropy
        slot = choice.pick(p.logits, prob, owner, fr, live, col)
        entropy = -(prob * logp.masked_fill(p.logits == float("-inf"), 0.0)).sum(1)
        steps_idx.append(live)
        steps_lp.append(logp[owner, slot])
        steps_ent.append(entropy.index_select(0, owner))
        action = fr.node.index_select(0, fr.offsets().index_select(0, owner) + slot)
        routes[live, col] = action
        go = (action != end).nonzero().squeeze(1)
        live = live.index_select(0, go)
        if live.numel():
            m = p.logits.shape[1]
            key = owner.index_select(0, go) * m + slot.index_select(0, go)
            key, owner = torch.unique(key, return_inverse=True)
            parent = torch.div(key, m, rounding_mode="floor")
            fr = dec.advance(fr, p, parent, key - parent * m)
        col += 1
    zero = torch.zeros(r, device=dev)
    if steps_idx:
        idx = torch.cat(steps_idx)
        log_prob = zero.index_add(0, idx, torch.cat(steps_lp))
        entropy = zero.index_add(0, idx, torch.cat(steps_ent))
    else:  # every route was forced: nothing to learn, but keep the training loop's backward valid
        grad = torch.is_grad_enabled() and any(p.requires_grad for p in dec.model.parameters())
        log_prob, entropy = (torch.zeros(r, device=dev, requires_grad=grad) for _ in range(2))
    return Rollout.of(instances, ids, routes, log_prob, entropy)


def greedy_routes(model: PointerNet, instances: Instances) -> list[list[int]]:
    """Each tourist's greedy route (node lists), without gradients."""
    with torch.inference_mode():
        out = rollout(model, instances, greedy=True)
    return [[v for v in route if v >= 0] for route in out.routes.tolist()]


def route_reward(instances: Instances, ids: torch.Tensor, routes: torch.Tensor) -> torch.Tensor:
    """Summed scores [R] of ``routes`` (padded with -1) of tourists ``ids`` (no host sync)."""
    scores = instances.scores.index_select(0, ids)
    return (scores.gather(1, routes.clamp(min=0)) * (routes >= 0)).sum(1)
