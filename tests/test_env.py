"""Tests of optw.env: instances, masks, the lookahead graph, features, routes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from optw.catalog import Region, Tourists, sample_tourists
from optw.env import (
    NEVER,
    check_route,
    dynamic_features,
    lookahead,
    make_instances,
    reset,
    reward,
    step,
)

REGIONS = ("c101", "r201", "pr01", "pr05", "t101", "t201")


def _units(x) -> int:
    return int(round(float(x) * 100))


class Brute:
    """A plain-Python re-simulation of one route with exact integer time units."""

    def __init__(self, region: Region, tourists: Tourists, k: int):
        self.n = region.n_nodes
        self.dist = [[_units(v) for v in row] for row in region.distances(tourists.start_xy[k])[0]]
        self.open = [_units(v) for v in region.opening]
        self.close = [_units(v) for v in region.closing]
        self.dur = [_units(v) for v in region.duration]
        self.ts, self.te = _units(tourists.t_start[k]), _units(tourists.t_end[k])
        self.open[0] = self.open[-1] = self.ts
        self.close[0] = self.close[-1] = self.te
        self.dur[0] = self.dur[-1] = 0

    def ok(self, t: int, cur: int, j: int) -> bool:
        """The paper's conditions for going from ``cur`` at time ``t`` to ``j``."""
        a = t + self.dist[cur][j]
        wait = max(0, self.open[j] - a)
        return (a + wait <= self.close[j]
                and a + wait + self.dur[j] + self.dist[j][self.n - 1] <= self.te)

    def replay(self, route: list[int]) -> tuple[int, int, list[bool]]:
        """(time, current, mask) after the route prefix; the mask is the AND over the steps
        of "unvisited and feasible now" (so inadmissible once means inadmissible for good)."""
        t, cur = self.ts, 0
        mask = [self.ok(t, cur, j) for j in range(self.n)]
        visited = set()
        for j in route:
            a = t + self.dist[cur][j]
            t = max(a, self.open[j]) + self.dur[j]
            cur = j
            visited.add(j)
            mask = [m and j2 not in visited and self.ok(t, cur, j2) for j2, m in enumerate(mask)]
            if j == self.n - 1:
                mask = [False] * self.n
        return t, cur, mask

    def lookahead(self, t: int, cur: int, mask: list[bool]) -> list[list[bool]]:
        ad = [[False] * self.n for _ in range(self.n)]
        for i in range(self.n):
            a = t + self.dist[cur][i]
            leave = max(a, self.open[i]) + self.dur[i]
            for j in range(self.n):
                ad[i][j] = i == j or (mask[j] and self.ok(leave, i, j))
        return ad


def _random_routes(inst, n_routes: int, seed: int):
    """Uniformly random admissible walks; yields every intermediate state."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.arange(n_routes) % inst.n_tourists
    state = reset(inst, ids)
    yield state
    state = step(inst, state, torch.zeros(n_routes, dtype=torch.long))
    while not bool(state.done.all()):
        yield state
        probs = state.mask.float() + state.done.float().unsqueeze(1) * torch.nn.functional.one_hot(
            state.current, inst.n_nodes).float()
        state = step(inst, state, torch.multinomial(probs, 1, generator=g).squeeze(1))
    yield state


@pytest.mark.parametrize("region_id", REGIONS)
def test_masks_and_graph_match_brute_force(catalog, region_id):
    """Admissible masks, times and the lookahead graph Ad of random states of real regions
    (every group, benchmark and generated tourists) equal a plain re-simulation."""
    region = catalog.region(region_id)
    tourists = Tourists.concat([catalog.benchmark(region_id),
                                sample_tourists(region, 3, rng=7)])
    inst = make_instances(region, tourists)
    brutes = [Brute(region, tourists, k) for k in range(len(tourists))]
    checked_ad = 0
    for s_i, state in enumerate(_random_routes(inst, 6, seed=1)):
        for r in range(state.n_routes):
            k = int(state.ids[r])
            route = [v for v in state.route[r].tolist() if v >= 0]
            t, cur, mask = brutes[k].replay(route)
            assert state.mask[r].tolist() == mask, (region_id, route)
            if route:
                assert int(state.time_u[r]) == t and int(state.current[r]) == cur
            if s_i % 4 == 1 and r < 2 and not bool(state.done[r]):
                ad = lookahead(inst, state)[r].tolist()
                assert ad == brutes[k].lookahead(int(state.time_u[r]), int(state.current[r]),
                                                 mask), (region_id, route)
                checked_ad += 1
    assert checked_ad > 0


def test_plain_definition_agrees_on_benchmark_walks(catalog):
    """The carried mask equals the plain "unvisited and feasible now" definition on random
    walks of real regions (they differ only if rounding breaks the triangle inequality)."""
    for region_id in ("pr01", "t101"):
        region = catalog.region(region_id)
        tourists = catalog.validation(region_id)[:4]
        inst = make_instances(region, tourists)
        brutes = [Brute(region, tourists, k) for k in range(len(tourists))]
        for state in _random_routes(inst, 8, seed=3):
            for r in range(state.n_routes):
                if bool(state.done[r]) or state.route.shape[1] == 0:
                    continue
                b = brutes[int(state.ids[r])]
                visited = set(state.route[r].tolist())
                plain = [j not in visited and b.ok(int(state.time_u[r]), int(state.current[r]), j)
                         for j in range(b.n)]
                assert state.mask[r].tolist() == plain


def test_dynamic_and_static_features_follow_the_spec(catalog):
    """The 8 dynamic and 7 static features have the spec's order and normalisers (coordinates
    /100, times /T_max, scores /S_max, dynamic times /(T_end - T_start))."""
    region = catalog.region("t101")
    tourists = sample_tourists(region, 2, rng=3)
    inst = make_instances(region, tourists)
    k, j = 1, 17
    st = inst.static[k, j].double()
    t_max, s_max = region.t_max, region.s_max
    expected = [region.x[j] / 100, region.y[j] / 100, region.duration[j] / region.max_duration,
                region.opening[j] / t_max, region.closing[j] / t_max,
                tourists.scores[k, j] / s_max, tourists.t_end[k] / t_max]
    assert np.allclose(st.numpy(), expected, atol=1e-6)
    assert inst.static[k, 0, 3] == pytest.approx(tourists.t_start[k] / t_max, abs=1e-6)
    assert inst.static[k, -1, 4] == pytest.approx(tourists.t_end[k] / t_max, abs=1e-6)

    state = reset(inst)
    state = step(inst, state, torch.zeros(2, dtype=torch.long))
    nxt = int(state.mask[k, 1:-1].nonzero()[0, 0]) + 1
    state = step(inst, state, torch.tensor([nxt, nxt]))
    t, cur = state.time_u[k].item() / 100, int(state.current[k])  # minutes
    ts, te = tourists.t_start[k], tourists.t_end[k]
    d = te - ts
    o, c = region.opening[j], region.closing[j]
    a = t + region.distances(tourists.start_xy[k])[0][cur, j]
    expected = [(o - t) / d, (c - t) / d, (te - t) / d, (t - ts) / d, (a - ts) / d,
                (o - a) / d, (c - a) / d, (te - a) / d]
    assert np.allclose(dynamic_features(inst, state)[k, j].double().numpy(), expected, atol=1e-6)


def _line_region(decimals: int = 1) -> Region:
    """Start at 0; points at x = 0.1, 0.2 (distances 0.1 apart) on a line."""
    x = np.array([0.0, 0.1, 0.2, 0.0])
    return Region(
        id="line", group="solomon", x=x, y=np.zeros(4), duration=np.array([0.0, 0.0, 0.0, 0.0]),
        opening=np.array([0.0, 0.0, 0.0, 0.0]), closing=np.array([10.0, 0.3, 0.3, 10.0]),
        score=np.array([0.0, 1.0, 1.0, 0.0]), t_start=0.2, t_end=10.0, decimals=decimals,
    )


def test_boundary_arrival_at_closing_time_is_exact():
    """Arriving exactly at a closing time is admissible: 0.2 + 0.1 == 0.3 in exact time units
    (it is 0.30000000000000004 in float64)."""
    region = _line_region()
    tourists = Tourists("line", np.array([0]), "benchmark", np.array([[0.0, 0.0]]),
                        np.array([0.2]), np.array([10.0]), region.score[None].copy())
    inst = make_instances(region, tourists)
    state = reset(inst)
    assert state.mask[0].tolist() == [True, True, False, True]  # node 2 is 0.2 away: 0.4 > 0.3
    assert 0.2 + 0.1 > 0.3  # what float arithmetic would say


def test_routes_pass_the_validator_and_rewards_match(catalog):
    """Random walks through the environment are valid routes (independent validator) and the
    environment's reward is their score."""
    for region_id in ("c101", "pr01", "t101"):
        region = catalog.region(region_id)
        tourists = catalog.validation(region_id)[:5]
        inst = make_instances(region, tourists)
        *_, final = _random_routes(inst, 10, seed=11)
        rewards = reward(inst, final)
        for r in range(final.n_routes):
            route = [v for v in final.route[r].tolist() if v >= 0]
            check = check_route(region, route, tourists, int(final.ids[r]))
            assert check.ok, check.problems
            assert rewards[r].item() == pytest.approx(check.score, rel=1e-5)


def test_start_sequence_and_inadmissible_step(catalog):
    """reset() keeps the start admissible; step(0) marks it visited at the same time; an
    inadmissible action raises ValueError; finished routes are left unchanged."""
    region = catalog.region("pr01")
    inst = make_instances(region, catalog.benchmark("pr01"))
    s0 = reset(inst)
    assert bool(s0.mask[0, 0]) and bool(s0.mask[0, -1]) and s0.route.shape == (1, 0)
    s1 = step(inst, s0, torch.tensor([0]))
    assert not bool(s1.mask[0, 0]) and int(s1.time_u[0]) == int(s0.time_u[0])
    with pytest.raises(ValueError, match="not admissible"):
        step(inst, s1, torch.tensor([0]))
    done = step(inst, s1, torch.tensor([inst.end]))
    assert bool(done.done[0]) and not bool(done.mask.any())
    again = step(inst, done, torch.tensor([3]))
    assert again.route[0].tolist() == [0, inst.end, -1]
    assert int(again.time_u[0]) == int(done.time_u[0])


def test_instances_validate_and_mark_unreachable_nodes(catalog):
    """make_instances rejects T_end <= T_start and another region's tourists; nodes whose
    window cannot fit the tourist get latest = NEVER; the shared distance block is the
    region's."""
    region = catalog.region("c101")
    tourists = catalog.benchmark("c101")
    bad = Tourists("c101", np.array([0]), "x", tourists.start_xy, np.array([50.0]),
                   np.array([50.0]), tourists.scores)
    with pytest.raises(ValueError, match="t_end"):
        make_instances(region, bad)
    with pytest.raises(ValueError, match="region"):
        make_instances(catalog.region("c102"), tourists)
    short = Tourists("c101", np.array([0]), "x", tourists.start_xy, np.array([0.0]),
                     np.array([1.0]), tourists.scores)
    inst = make_instances(region, short)
    assert (inst.node_u[0, 1:-1, 3] == NEVER).all()
    full = make_instances(region, tourists)
    base = torch.as_tensor(np.rint(region.distances() * 100).astype(np.int32))
    assert torch.equal(full.dist_u[0, 1:-1, 1:-1], base[1:-1, 1:-1])


def test_the_validator_refuses_nodes_out_of_range_at_either_end(tiny_catalog):
    """A route whose first or last node is outside the region is refused with a problem that
    names it (it once raised IndexError scheduling it)."""
    from optw.env import check_route

    region = tiny_catalog.region("t199")
    n = region.n_nodes
    for route, word in (([0, 3, 999], "ends at node 999"), ([-5, 3, n - 1], "starts at node -5")):
        check = check_route(region, route)
        assert not check.ok and any(word in p for p in check.problems), check.problems
