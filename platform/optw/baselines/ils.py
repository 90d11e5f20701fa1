"""Iterated Local Search (Vansteenwegen et al., 2009) for one OPTW route, compiled with numba.

The algorithm and its pinned details (tie-breaking, shake, stopping rule, our own pins for scores
<= 0 and Shift <= 0) follow ``shared/spec/ils.md``, summarised in ``docs/ils.md``. All times are
exact integers in hundredths of a minute, so boundary cases never flip on floating-point noise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numba as nb
import numpy as np

from optw.catalog.region import Region, Tourists, to_time_units

#: Bump when a change to the algorithm can change any result (stored results are recomputed).
ILS_VERSION = 1
#: The published stopping rule: iterations in a row without a strictly better score.
MAX_ITER_NO_IMPROVE = 150

# Indices into the integer state vector of a run.
_L, _BEST_L, _S, _R, _NOIMP, _ITERS = range(6)
_BIG = np.iinfo(np.int64).max // 4


@nb.njit(cache=True)
def _forward(rt, length, dist, opening, duration, a, w, s):
    """Earliest schedule of route ``rt[:length]``: arrival, wait and start per position."""
    a[0] = s[0] = opening[rt[0]]
    w[0] = 0
    for p in range(1, length):
        i, v = rt[p - 1], rt[p]
        a[p] = s[p - 1] + duration[i] + dist[i, v]
        w[p] = max(0, opening[v] - a[p])
        s[p] = a[p] + w[p]


@nb.njit(cache=True)
def _backward(rt, upto, length, closing, w, s, ms):
    """MaxShift for positions ``upto`` down to 0 (the end's MaxShift is T_end - a_end)."""
    if upto >= length - 1:
        upto = length - 1
        ms[upto] = closing[rt[upto]] - s[upto]
        upto -= 1
    for p in range(upto, -1, -1):
        ms[p] = min(closing[rt[p]] - s[p], w[p + 1] + ms[p + 1])


@nb.njit(cache=True)
def _insertion_shift(rt, p, j, dist, opening, closing, duration, w, s, ms):
    """Shift of inserting ``j`` between positions ``p`` and ``p+1``; ``_BIG`` if infeasible
    (O(1): j starts by its closing and Shift <= Wait_k + MaxShift_k)."""
    i, k = rt[p], rt[p + 1]
    arr = s[p] + duration[i] + dist[i, j]
    if arr > closing[j]:
        return _BIG
    wj = max(0, opening[j] - arr)
    shift = dist[i, j] + wj + duration[j] + dist[j, k] - dist[i, k]
    if shift > w[p + 1] + ms[p + 1]:
        return _BIG
    return shift


@nb.njit(cache=True)
def _best_insertion(rt, length, inr, dist, opening, closing, duration, score, w, s, ms):
    """(node, position, shift) of the best S^2/Shift insertion, node -1 if none fits (scores
    <= 0 never inserted; Shift <= 0 has ratio +inf)."""
    best_j, best_p, best_shift, best_ratio = -1, -1, 0, -1.0
    for j in range(1, dist.shape[0] - 1):
        if inr[j] or score[j] <= 0.0:
            continue
        jp, jshift = -1, _BIG
        for p in range(length - 1):
            sh = _insertion_shift(rt, p, j, dist, opening, closing, duration, w, s, ms)
            if sh < jshift:  # strict: ties keep the earliest position
                jshift, jp = sh, p
        if jp < 0:
            continue
        ratio = np.inf if jshift <= 0 else score[j] * score[j] / jshift
        if ratio > best_ratio:  # strict: ties keep the lower node index
            best_ratio, best_j, best_p, best_shift = ratio, j, jp, jshift
    return best_j, best_p, best_shift


@nb.njit(cache=True)
def _insert(rt, length, j, p, shift, inr, dist, opening, closing, duration, a, w, s, ms):
    """Insert ``j`` after position ``p`` (shift forward, MaxShift backwards); the new length."""
    for q in range(length, p + 1, -1):  # make room at p+1
        rt[q] = rt[q - 1]
        a[q], w[q], s[q], ms[q] = a[q - 1], w[q - 1], s[q - 1], ms[q - 1]
    length += 1
    i = rt[p]
    rt[p + 1] = j
    inr[j] = True
    a[p + 1] = s[p] + duration[i] + dist[i, j]
    w[p + 1] = max(0, opening[j] - a[p + 1])
    s[p + 1] = a[p + 1] + w[p + 1]
    delta = shift
    for q in range(p + 2, length):
        if delta == 0:
            break
        a[q] += delta
        new_s = max(a[q], opening[rt[q]])  # the published update, exact for shift < 0 too
        delta = new_s - s[q]  # == max(0, shift - old Wait) for a non-negative shift
        w[q] = new_s - a[q]
        s[q] = new_s
        ms[q] -= delta
    _backward(rt, p + 1, length, closing, w, s, ms)
    return length


@nb.njit(cache=True)
def _local_search(rt, length, inr, dist, opening, closing, duration, score, a, w, s, ms):
    """Insert by best ratio until no unrouted point fits; returns the new length."""
    while True:
        j, p, shift = _best_insertion(rt, length, inr, dist, opening, closing, duration, score,
                                      w, s, ms)
        if j < 0:
            return length
        length = _insert(rt, length, j, p, shift, inr, dist, opening, closing, duration,
                         a, w, s, ms)


@nb.njit(cache=True)
def _shake(rt, length, r, start, inr, dist, opening, closing, duration, a, w, s, ms):
    """Remove ``r`` consecutive visits from visit ``start mod m`` (wrapping); re-time early."""
    m = length - 2
    if m <= 0 or r <= 0:
        return length
    keep = np.ones(m, dtype=np.bool_)
    for t in range(min(r, m)):
        keep[(start + t) % m] = False
    q = 1
    for v in range(m):
        node = rt[v + 1]
        if keep[v]:
            rt[q] = node
            q += 1
        else:
            inr[node] = False
    rt[q] = rt[length - 1]
    length = q + 1
    _forward(rt, length, dist, opening, duration, a, w, s)
    _backward(rt, length - 1, length, closing, w, s, ms)
    return length


@nb.njit(cache=True)
def _route_score(inr, score):
    """Score of the routed set, summed in node order (equal sets give equal floats)."""
    total = 0.0
    for j in range(inr.shape[0]):
        if inr[j]:
            total += score[j]
    return total


@nb.njit(cache=True)
def _ils_steps(dist, opening, closing, duration, score, max_noimp, r_reset, state, best_score,
               rt, inr, a, w, s, ms, best_rt, max_steps):
    """Run up to ``max_steps`` ILS iterations on the state; True when the stop rule is met."""
    steps = 0
    while state[_NOIMP] < max_noimp:
        if steps >= max_steps:
            return False
        length = _local_search(rt, state[_L], inr, dist, opening, closing, duration, score,
                               a, w, s, ms)
        sc = _route_score(inr, score)
        if sc > best_score[0]:
            best_score[0] = sc
            best_rt[:length] = rt[:length]
            state[_BEST_L] = length
            state[_R] = 1
            state[_NOIMP] = 0
        else:
            state[_NOIMP] += 1
        state[_ITERS] += 1
        steps += 1
        length = _shake(rt, length, state[_R], state[_S], inr, dist, opening, closing,
                        duration, a, w, s, ms)
        state[_L] = length
        state[_S] += state[_R]
        state[_R] += 1
        if state[_S] >= length - 2:
            state[_S] -= length - 2
        if state[_R] >= r_reset:
            state[_R] = 1
    return True


@dataclass(frozen=True, eq=False)
class IlsProblem:
    """One tourist's instance in exact integer time units (hundredths of a minute); the start
    and end nodes open and close at the tourist's T_start/T_end."""

    dist: np.ndarray  # [n, n] int64
    opening: np.ndarray  # [n] int64
    closing: np.ndarray  # [n] int64 (latest start)
    duration: np.ndarray  # [n] int64
    score: np.ndarray  # [n] float64

    @property
    def n_nodes(self) -> int:
        return int(self.dist.shape[0])

    @classmethod
    def from_region(cls, region: Region, tourists: Tourists | None = None,
                    index: int = 0) -> IlsProblem:
        """Tourist ``index`` of ``tourists`` (default: the benchmark tourist)."""
        if tourists is None:
            start_xy, f32 = np.array([region.start_xy], dtype=np.float64), False
            t_start, t_end, score = region.t_start, region.t_end, region.score
        else:
            if not 0 <= index < len(tourists):
                raise IndexError(f"tourist index {index} out of range (batch of {len(tourists)})")
            start_xy, f32 = tourists.start_xy[index : index + 1], tourists.start_rows_f32
            t_start, t_end = float(tourists.t_start[index]), float(tourists.t_end[index])
            score = tourists.scores[index]
        dist = region.distances(start_xy, f32)[0]
        opening, closing = to_time_units(region.opening), to_time_units(region.closing)
        opening[0] = opening[-1] = to_time_units(t_start)
        closing[0] = closing[-1] = to_time_units(t_end)
        return cls(dist=np.ascontiguousarray(to_time_units(dist)), opening=opening, closing=closing,
                   duration=to_time_units(region.duration),
                   # a writable copy: numba compiles read-only (pandas/arrow) views as another
                   # signature
                   score=np.array(score, dtype=np.float64, copy=True))


class RouteState:
    """A route with its Wait/MaxShift bookkeeping (exposes the kernels for tests/debugging)."""

    def __init__(self, problem: IlsProblem, route: list[int] | None = None):
        n, p = problem.n_nodes, problem
        self.p = problem
        self.rt, self.a, self.w, self.s, self.ms = (np.zeros(n + 1, np.int64) for _ in range(5))
        self.inr = np.zeros(n, dtype=np.bool_)
        route = [0, n - 1] if route is None else [int(v) for v in route]
        self.length = len(route)
        self.rt[: self.length] = route
        self.inr[route[1:-1]] = True
        self.times = (p.dist, p.opening, p.closing, p.duration)  # the kernels' instance args
        _forward(self.rt, self.length, p.dist, p.opening, p.duration, self.a, self.w, self.s)
        _backward(self.rt, self.length - 1, self.length, p.closing, self.w, self.s, self.ms)

    @property
    def route(self) -> list[int]:
        return self.rt[: self.length].tolist()

    def schedule(self) -> dict[str, np.ndarray]:
        """Copies of arrival, wait, start and MaxShift per position."""
        return {k: getattr(self, k)[: self.length].copy() for k in ("a", "w", "s", "ms")}

    def insertion_shift(self, j: int, pos: int) -> int | None:
        """Shift of inserting ``j`` after position ``pos``, None when the O(1) check fails."""
        sh = _insertion_shift(self.rt, pos, j, *self.times, self.w, self.s, self.ms)
        return None if sh == _BIG else int(sh)

    def best_insertion(self) -> tuple[int, int, int] | None:
        """(node, position, shift) the local search would insert next, None at a local optimum."""
        j, pos, sh = _best_insertion(self.rt, self.length, self.inr, *self.times, self.p.score,
                                     self.w, self.s, self.ms)
        return None if j < 0 else (int(j), int(pos), int(sh))

    def insert(self, j: int, pos: int) -> None:
        """Insert ``j`` after position ``pos`` with the incremental update (must be feasible)."""
        if (sh := self.insertion_shift(j, pos)) is None:
            raise ValueError(f"inserting node {j} after position {pos} is infeasible")
        self.length = _insert(self.rt, self.length, j, pos, sh, self.inr, *self.times, self.a,
                              self.w, self.s, self.ms)

    def local_search(self) -> None:
        self.length = _local_search(self.rt, self.length, self.inr, *self.times, self.p.score,
                                    self.a, self.w, self.s, self.ms)

    def shake(self, r: int, start: int) -> None:
        self.length = _shake(self.rt, self.length, r, start, self.inr, *self.times, self.a,
                             self.w, self.s, self.ms)


@dataclass(frozen=True)
class IlsResult:
    """Best route found (``[0, ..., n-1]``), its score, wall time and ILS iterations."""

    route: list[int]
    score: float
    seconds: float
    iterations: int
    timed_out: bool = False


def solve_problem(problem: IlsProblem, max_iter_no_improve: int = MAX_ITER_NO_IMPROVE,
                  time_limit: float | None = None) -> IlsResult:
    """Run the ILS on a prepared :class:`IlsProblem` (see :func:`solve_ils`)."""
    t0 = time.perf_counter()
    if max_iter_no_improve < 1:
        raise ValueError(f"max_iter_no_improve must be >= 1, got {max_iter_no_improve}")
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"time_limit must be positive seconds or None, got {time_limit}")
    st = RouteState(problem)
    r_reset = max(1, (problem.n_nodes - 2) // 3)  # the shake length restarts at a third
    state = np.zeros(6, dtype=np.int64)
    state[_L], state[_BEST_L], state[_S], state[_R] = st.length, st.length, 1, 1
    best_score = np.zeros(1, dtype=np.float64)
    best_rt = st.rt.copy()
    args = (problem.dist, problem.opening, problem.closing, problem.duration, problem.score,
            int(max_iter_no_improve), r_reset, state, best_score, st.rt, st.inr, st.a, st.w,
            st.s, st.ms, best_rt)
    timed_out = False
    if time_limit is None:
        _ils_steps(*args, _BIG)
    else:  # one iteration at a time until the stop rule or the deadline
        deadline = t0 + time_limit
        while not timed_out and not _ils_steps(*args, 1):
            timed_out = time.perf_counter() >= deadline
    route = best_rt[: state[_BEST_L]].tolist()
    score = float(np.sum(problem.score[route[1:-1]]))
    return IlsResult(route, score, time.perf_counter() - t0, int(state[_ITERS]), timed_out)


def solve_ils(region: Region, tourists: Tourists | None = None, index: int = 0,
              max_iter_no_improve: int = MAX_ITER_NO_IMPROVE,
              time_limit: float | None = None) -> IlsResult:
    """Deterministic ILS route for tourist ``index`` of ``tourists`` (default: the benchmark
    tourist); past ``time_limit`` seconds the best route so far with ``timed_out=True``.
    ``seconds`` includes preparing the instance."""
    t0 = time.perf_counter()
    res = solve_problem(IlsProblem.from_region(region, tourists, index), max_iter_no_improve,
                        time_limit)
    return replace(res, seconds=time.perf_counter() - t0)


def solve_ils_batch(region: Region, tourists: Tourists,
                    max_iter_no_improve: int = MAX_ITER_NO_IMPROVE,
                    time_limit: float | None = None,
                    indices: list[int] | None = None) -> list[IlsResult]:
    """:func:`solve_ils` for every tourist of the batch (or the given ``indices``), in order."""
    idx = range(len(tourists)) if indices is None else indices
    return [solve_ils(region, tourists, int(i), max_iter_no_improve, time_limit) for i in idx]


def warm_up() -> None:
    """Compile (or load from the numba cache) every kernel on a tiny instance."""
    region = Region(
        id="warm-up", group="solomon", x=np.array([0, 1.0, 2.0, 0]), y=np.zeros(4),
        duration=np.ones(4), opening=np.zeros(4), closing=np.full(4, 100.0),
        score=np.array([0, 1.0, 2.0, 0]), t_start=0.0, t_end=100.0, decimals=1)
    solve_problem(IlsProblem.from_region(region), max_iter_no_improve=3)
