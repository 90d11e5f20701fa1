"""ILS baseline: kernels against brute force, determinism, validity, paper fidelity, store/CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import copy_catalog
from optw.baselines import (
    IlsProblem,
    RouteState,
    load_ils_results,
    run_ils_baseline,
    solve_ils,
    solve_ils_batch,
    solve_problem,
)
from optw.baselines.ils import warm_up
from optw.catalog import Region
from optw.catalog.store import PROJECT_ROOT, open_catalog
from optw.env.validate import check_route

# ----------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def cat(catalog):
    """The project's catalog (conftest's ``catalog``)."""
    return catalog


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    warm_up()


def make_region(seed: int, n_points: int = 12, decimals: int = 1) -> Region:
    """A random small region: some zero durations and co-located points (Shift <= 0 cases),
    tight and loose time windows, integer scores."""
    rng = np.random.default_rng(seed)
    n = n_points + 2
    xy = rng.uniform(0, 40, size=(n, 2)).round(1)
    xy[-1] = xy[0]
    dup = rng.choice(np.arange(1, n - 1), size=2, replace=False)
    xy[dup[1]] = xy[dup[0]]  # two points at the same place
    duration = rng.choice([0.0, 0.0, 2.5, 5.0, 10.0], size=n)
    opening = rng.uniform(0, 120, size=n).round(2)
    closing = opening + rng.choice([5.0, 20.0, 60.0, 200.0], size=n)
    duration[[0, -1]] = 0.0
    opening[[0, -1]], closing[[0, -1]] = 0.0, 200.0
    # Collinear zero-duration points: rounded-down distances give Shift < 0 (1.0 + 1.0 - 2.1)
    # and co-located twins Shift == 0.
    xy[1:4] = [[5.0, 5.0], [6.05, 5.0], [7.1, 5.0]]
    duration[1:4] = duration[dup] = 0.0
    opening[1:4], closing[1:4] = 0.0, 200.0
    score = rng.integers(1, 30, size=n).astype(np.float64)
    score[[0, -1]] = 0.0
    return Region(
        id=f"synthetic-{seed}", group="solomon", x=xy[:, 0], y=xy[:, 1], duration=duration,
        opening=opening, closing=closing, score=score, t_start=0.0, t_end=200.0,
        decimals=decimals,
    )


def simulate(p: IlsProblem, route: list[int], forced: tuple[int, int] | None = None):
    """Brute-force earliest schedule; ``forced=(pos, start)`` delays one visit's start.

    Returns (feasible, arrival, wait, start) with exact integers.
    """
    a, w, s = [int(p.opening[route[0]])], [0], [int(p.opening[route[0]])]
    ok = True
    if forced is not None and forced[0] == 0:
        s[0] = forced[1]
    for pos in range(1, len(route)):
        i, v = route[pos - 1], route[pos]
        arr = s[-1] + int(p.duration[i]) + int(p.dist[i, v])
        st = max(arr, int(p.opening[v]))
        if forced is not None and forced[0] == pos:
            st = max(st, forced[1])
        ok &= st <= int(p.closing[v])
        a.append(arr), w.append(max(0, int(p.opening[v]) - arr)), s.append(st)
    if forced is not None and forced[0] == 0:
        ok &= s[0] <= int(p.closing[route[0]])
    return ok, a, w, s


def brute_max_shift(p: IlsProblem, route: list[int], pos: int, start: int) -> int:
    """Largest delay of visit ``pos`` keeping the route feasible (binary search)."""
    lo, hi = 0, int(p.closing[route[pos]]) - start
    if hi < 0 or not simulate(p, route, (pos, start))[0]:
        return -1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if simulate(p, route, (pos, start + mid))[0]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def assert_bookkeeping(st: RouteState) -> None:
    route = st.route
    ok, a, w, s = simulate(st.p, route)
    assert ok, f"route {route} is infeasible"
    sched = st.schedule()
    assert sched["a"].tolist() == a
    assert sched["w"].tolist() == w
    assert sched["s"].tolist() == s
    ms = [brute_max_shift(st.p, route, q, s[q]) for q in range(len(route))]
    assert sched["ms"].tolist() == ms


# ----------------------------------------------------------------------------- kernels


@pytest.mark.parametrize("seed", range(6))
def test_insertion_check_matches_resimulation(seed):
    """The O(1) Wait/MaxShift test accepts exactly the inserts that a full re-simulation finds
    feasible, and Shift equals the change of the next visit's arrival."""
    problem = IlsProblem.from_region(make_region(seed, decimals=1 + seed % 2))
    st = RouteState(problem)
    rng = np.random.default_rng(seed)
    checked = 0
    for _ in range(8):
        route = st.route
        old = simulate(problem, route)
        for j in range(1, problem.n_nodes - 1):
            if j in route:
                continue
            for pos in range(len(route) - 1):
                cand = route[: pos + 1] + [j] + route[pos + 1 :]
                ok, a, _, _ = simulate(problem, cand)
                sh = st.insertion_shift(j, pos)
                assert (sh is not None) == ok, (route, j, pos)
                if ok:
                    assert sh == a[pos + 2] - old[1][pos + 1]
                checked += 1
        feasible = [(j, q) for j in range(1, problem.n_nodes - 1) if j not in route
                    for q in range(len(route) - 1) if st.insertion_shift(j, q) is not None]
        if not feasible:
            break
        st.insert(*feasible[rng.integers(len(feasible))])
    assert checked > 50


@pytest.mark.parametrize("seed", range(6))
def test_insert_bookkeeping_matches_resimulation(seed):
    """After each incremental insert, arrival/Wait/start equal a full re-simulation and
    MaxShift equals the brute-force largest feasible delay of every visit."""
    problem = IlsProblem.from_region(make_region(100 + seed, n_points=14))
    st = RouteState(problem)
    rng = np.random.default_rng(seed)
    inserts = 0
    while True:
        route = st.route
        feasible = [(j, q) for j in range(1, problem.n_nodes - 1) if j not in route
                    for q in range(len(route) - 1) if st.insertion_shift(j, q) is not None]
        if not feasible:
            break
        st.insert(*feasible[rng.integers(len(feasible))])
        inserts += 1
        assert_bookkeeping(st)
    assert inserts >= 3


def test_local_search_reaches_local_optimum_by_ratio():
    """The local search inserts the best S^2/Shift node each step and stops only when no
    unrouted point fits anywhere (checked by re-simulation)."""
    problem = IlsProblem.from_region(make_region(7, n_points=15))
    st = RouteState(problem)
    while (best := st.best_insertion()) is not None:
        j, pos, sh = best
        ratios = {}
        for v in range(1, problem.n_nodes - 1):
            if v in st.route:
                continue
            shifts = [st.insertion_shift(v, q) for q in range(len(st.route) - 1)]
            shifts = [x for x in shifts if x is not None]
            if shifts:
                m = min(shifts)
                ratios[v] = np.inf if m <= 0 else problem.score[v] ** 2 / m
        top = max(ratios.values())
        assert j == min(v for v, r in ratios.items() if r == top)
        st.insert(j, pos)
    route = st.route
    for j in range(1, problem.n_nodes - 1):
        if j not in route:
            for q in range(len(route) - 1):
                assert not simulate(problem, route[: q + 1] + [j] + route[q + 1 :])[0]
    assert_bookkeeping(st)


def test_ties_go_to_lower_index_and_earliest_position():
    """Equal ratios insert the lower node index; equal shifts use the earliest position."""
    xy = np.array([[0, 0], [3, 4], [4, 3], [0, 0]], dtype=np.float64)
    region = Region(
        id="ties", group="solomon", x=xy[:, 0], y=xy[:, 1], duration=np.zeros(4),
        opening=np.zeros(4), closing=np.full(4, 10.5), score=np.array([0, 5.0, 5.0, 0]),
        t_start=0.0, t_end=10.5, decimals=1,
    )
    res = solve_ils(region)
    assert res.route == [0, 1, 3] and res.score == 5.0

    xy = np.array([[0, 0], [10, 0], [0, 0], [0, 0]], dtype=np.float64)
    region = Region(
        id="positions", group="solomon", x=xy[:, 0], y=xy[:, 1],
        duration=np.array([0, 0, 2.0, 0]), opening=np.zeros(4), closing=np.full(4, 100.0),
        score=np.array([0, 5.0, 5.0, 0]), t_start=0.0, t_end=100.0, decimals=1,
    )
    st = RouteState(IlsProblem.from_region(region), [0, 1, 3])
    assert st.insertion_shift(2, 0) == st.insertion_shift(2, 1) == 200
    assert st.best_insertion() == (2, 0, 200)


def test_negative_and_zero_shift_bookkeeping():
    """Rounded-down distances break the triangle inequality: an insert with Shift < 0 (and a
    co-located one with Shift == 0) keeps the schedule exact and gets ratio +inf."""
    xy = np.array([[0, 0], [5, 0], [6.05, 0], [7.1, 0], [7.1, 0], [20, 0], [0, 0]])
    n = len(xy)
    region = Region(
        id="shifts", group="solomon", x=xy[:, 0], y=xy[:, 1],
        duration=np.array([0, 0, 0, 0, 0, 3.0, 0]),
        opening=np.array([0, 0, 0, 0, 0, 12.0, 0]), closing=np.full(n, 100.0),
        score=np.array([0, 1.0, 1.0, 1.0, 1.0, 1.0, 0]), t_start=0.0, t_end=100.0,
        decimals=1,
    )
    st = RouteState(IlsProblem.from_region(region), [0, 1, 3, 5, 6])
    assert st.insertion_shift(2, 1) == -10  # 1.0 + 1.0 - 2.1
    assert st.insertion_shift(4, 2) == 0  # co-located with node 3
    assert st.best_insertion()[:2] == (2, 1)  # ratio +inf, lower index than node 4
    st.insert(2, 1)
    assert_bookkeeping(st)
    st.insert(4, 3)
    assert_bookkeeping(st)
    assert st.route == [0, 1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("seed", range(4))
def test_shake_keeps_feasibility(seed):
    """shake(R, S) removes R consecutive visits from visit S mod m, wrapping past the end; the
    route stays feasible and the retimed bookkeeping is exact."""
    problem = IlsProblem.from_region(make_region(200 + seed, n_points=16))
    rng = np.random.default_rng(seed)
    for _ in range(12):
        st = RouteState(problem)
        st.local_search()
        visits = st.route[1:-1]
        m = len(visits)
        assert m >= 2
        r, s = int(rng.integers(1, m + 2)), int(rng.integers(0, 3 * m))
        removed = {visits[(s % m + t) % m] for t in range(min(r, m))}
        st.shake(r, s)
        assert st.route[1:-1] == [v for v in visits if v not in removed]
        assert set(np.flatnonzero(st.inr)) == set(st.route[1:-1])
        assert_bookkeeping(st)


# ----------------------------------------------------------------------------- solver


def test_deterministic(cat):
    """Two runs on the same tourist give the same route, score and iteration count."""
    region = cat.region("r202")
    val = cat.validation("r202")
    for i in (None, 3):
        a = solve_ils(region, None if i is None else val, i or 0)
        b = solve_ils(region, None if i is None else val, i or 0)
        assert (a.route, a.score, a.iterations) == (b.route, b.score, b.iterations)
    batch = solve_ils_batch(region, val[:3])
    assert [r.route for r in batch] == [solve_ils(region, val, i).route for i in range(3)]


@pytest.mark.parametrize("seed", range(8))
def test_synthetic_routes_validate(seed):
    """Every route the ILS returns on random synthetic regions passes check_route."""
    region = make_region(300 + seed, n_points=20, decimals=1 + seed % 2)
    res = solve_ils(region)
    chk = check_route(region, res.route, claimed_score=res.score)
    assert chk.ok, chk.problems
    assert res.iterations >= 150


@pytest.mark.parametrize("rid", ["c101", "r105", "rc208", "pr01", "pr10", "t101", "t201"])
def test_real_routes_validate(cat, rid):
    """Routes for the benchmark tourist and some validation tourists of real regions (all
    groups, including the largest) validate and report their true score."""
    region = cat.region(rid)
    val = cat.validation(rid)
    results = [(None, 0, solve_ils(region))]
    results += [(val, i, solve_ils(region, val, i)) for i in (0, 17, 63)]
    for tourists, i, res in results:
        chk = check_route(region, res.route, tourists, i, claimed_score=res.score)
        assert chk.ok, (rid, i, chk.problems)
        assert res.route[0] == 0 and res.route[-1] == region.n_nodes - 1


def test_time_limit_and_arguments(cat):
    """A time cap stops early with a valid route; bad arguments are rejected."""
    region = cat.region("pr10")
    res = solve_ils(region, time_limit=0.005)
    assert check_route(region, res.route, claimed_score=res.score).ok
    full = solve_ils(region)
    assert res.timed_out and res.iterations < full.iterations
    assert not full.timed_out
    problem = IlsProblem.from_region(region)
    with pytest.raises(ValueError):
        solve_problem(problem, max_iter_no_improve=0)
    with pytest.raises(ValueError):
        solve_problem(problem, time_limit=0)
    with pytest.raises(IndexError):
        solve_ils(region, cat.validation("pr10"), 64)


# ----------------------------------------------------------------------------- fidelity


def _reference_csv() -> Path:
    env = os.environ.get("OPTW_REFERENCE")
    folder = Path(env) if env else PROJECT_ROOT.parent / "shared" / "reference"
    return folder / "paper_benchmark_scores.csv"


def test_fidelity_against_paper(cat):
    """On the 109 benchmark tourists our ILS matches the paper's ILS column: every group mean
    within 1.5%, at most 10 regions more than 5% below, none more than 15% below."""
    path = _reference_csv()
    if not path.exists():
        pytest.skip(f"no reference scores at {path}")
    ref = pd.read_csv(path).set_index("instance")
    rows = []
    for rid in cat.list_regions():
        region = cat.region(rid)
        res = solve_ils(region)
        assert check_route(region, res.route, claimed_score=res.score).ok
        rows.append({"region": rid, "group": region.group, "ours": res.score,
                     "paper": float(ref.at[rid, "ils"])})
    df = pd.DataFrame(rows)
    assert len(df) == 109
    means = df.groupby("group")[["ours", "paper"]].mean()
    rel = (means["ours"] - means["paper"]) / means["paper"] * 100
    assert (rel.abs() <= 1.5).all(), rel.round(2).to_dict()
    below = (df["paper"] - df["ours"]) / df["paper"] * 100
    worst = df.assign(below=below).nlargest(10, "below")[["region", "below"]]
    assert (below > 5).sum() <= 10, worst.to_dict("records")
    assert (below <= 15).all(), worst.to_dict("records")


# ----------------------------------------------------------------------------- store / CLI


@pytest.fixture()
def tmp_catalog(cat, tmp_path):
    """A private copy of the catalog (the store is written beside it)."""
    return copy_catalog(cat, tmp_path / "catalog")


def test_store_is_incremental_and_atomic(tmp_catalog):
    """Stored (region, tourist) pairs are not recomputed; the store holds full rows only and
    no temporary files are left behind."""
    run = run_ils_baseline(tmp_catalog, regions=["c101"], tourists="benchmark", workers=1,
                           progress=False)
    assert (run.computed, run.cached) == (1, 0)
    run = run_ils_baseline(tmp_catalog, regions=["c101", "pr01"], tourists="all", workers=1,
                           progress=False)
    assert (run.computed, run.cached) == (129, 1)
    df = load_ils_results(tmp_catalog)
    assert len(df) == 130 and not df.duplicated(["region", "tourist"]).any()
    assert set(df["kind"]) == {"benchmark", "validation"}
    assert sorted(p.name for p in (tmp_catalog / "baselines").iterdir()) == ["ils.parquet"]
    cat = open_catalog(tmp_catalog)
    for row in df.sample(10, random_state=0).itertuples():
        batch = cat.tourists(row.region, row.kind)
        i = int(np.flatnonzero(batch.tourist_id == row.tourist)[0])
        assert check_route(cat.region(row.region), row.route, batch, i,
                           claimed_score=row.score).ok
    run = run_ils_baseline(tmp_catalog, regions=["pr01"], workers=1, progress=False)
    assert run.computed == 0 and len(run.results) == 65


def test_cli_json_and_errors(tmp_catalog, capsys):
    """`optw baseline ils --json` prints one JSON object per tourist (new and stored); bad
    selections give a one-line error."""
    from optw.cli import main

    assert main(["baseline", "ils", "--catalog", str(tmp_catalog), "--regions", "t101",
                 "--tourists", "benchmark", "--workers", "1", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["baseline", "ils", "--catalog", str(tmp_catalog), "--regions", "t101,c101",
                 "--tourists", "benchmark", "--json", "--workers", "1", "--quiet"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert sorted((r["region"], r["cached"]) for r in lines) == [("c101", False),
                                                                  ("t101", True)]
    assert main(["baseline", "ils", "--catalog", str(tmp_catalog), "--regions", "c1o1"]) == 2
    assert "c101" in capsys.readouterr().err
    assert main(["baseline", "ils", "--catalog", str(tmp_catalog), "--groups", "nope"]) == 2


def test_ray_workers(tmp_catalog):
    """With several workers the batches run as Ray tasks and give the same results as the
    in-process run."""
    pytest.importorskip("ray")
    run = run_ils_baseline(tmp_catalog, regions=["c101", "t101"], tourists="validation",
                           workers=2, progress=False)
    assert run.computed == 128
    ref = solve_ils_batch(open_catalog(tmp_catalog).region("t101"),
                          open_catalog(tmp_catalog).validation("t101"), indices=[0, 5])
    df = run.results.set_index(["region", "tourist"])
    assert [list(df.at[("t101", t), "route"]) for t in (1, 6)] == [r.route for r in ref]


def test_all_tourists_of_a_custom_region_in_a_catalog_with_paper_sets(tmp_path):
    """`--tourists all` in a catalog with the paper's sets solves a custom region's benchmark
    and validation tourists (a custom region has no paper set) instead of refusing it."""
    from conftest import write_tiny_source
    from optw.catalog.store import add_region, build_catalog

    cat = tmp_path / "catalog"
    build_catalog(write_tiny_source(tmp_path / "src"), cat, paper_sets=True, device="cpu")
    add_region("grid", PROJECT_ROOT / "tests" / "fixtures" / "custom" / "grid.csv", catalog=cat)
    run = run_ils_baseline(cat, regions=["grid"], tourists="all", workers=1, progress=False)
    assert run.computed == 65 and set(run.results["kind"]) == {"benchmark", "validation"}
