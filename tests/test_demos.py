"""Demonstrations (optw.baselines.demos, optw.env.demos): their tourists never are tourists the
models are scored on, their routes are valid ILS routes, the store reuses what it holds, and
a demonstration the environment does not admit is an error naming region and tourist."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from optw.baselines.demos import demo_tourists, demos_path, get_demos
from optw.catalog import VALIDATION_SEED, Tourists
from optw.env import check_route
from optw.env.demos import Demonstrations, actions
from optw.errors import UserError
from optw.train import TrainConfig, train


def _rows(t):
    return {np.concatenate([t.start_xy[i], [t.t_start[i], t.t_end[i]], t.scores[i]]).tobytes()
            for i in range(len(t))}


@pytest.mark.parametrize("region_id", ["c101", "pr01", "t101"])
def test_demonstration_tourists_are_never_scored_tourists(catalog, region_id):
    """For any seed, the validation sets' own seed included, no demonstration tourist equals a
    validation or benchmark tourist of its region (the streams differ, and equal tourists are
    dropped: a held-out set made of the stream's own first tourists is skipped and the set
    still has n tourists); ids are their own; the first n of a longer set are the n of a
    shorter one."""
    region = catalog.region(region_id)
    held = [catalog.validation(region_id), catalog.benchmark(region_id)]
    for seed in (VALIDATION_SEED, 0, 7):
        demos = demo_tourists(region, 300, seed, held)
        assert len(demos) == 300 and not _rows(demos) & set().union(*map(_rows, held))
        assert demos.tourist_id.min() > catalog.validation(region_id).tourist_id.max()
    first = demo_tourists(region, 70, 7, held)
    assert _rows(first) <= _rows(demo_tourists(region, 300, 7, held))
    assert np.array_equal(first.scores, demo_tourists(region, 300, 7, held).scores[:70])
    skipped = demo_tourists(region, 70, 7, [first[:5]])
    assert len(skipped) == 70 and not _rows(skipped) & _rows(first[:5])
    assert np.array_equal(skipped.scores[:65], first.scores[5:])


def test_demonstrations_are_stored_valid_ils_routes_and_reused(tiny_catalog):
    """get_demos computes ILS routes that pass the route validator with their scores, stores
    them in the catalog's baselines/demos.parquet, and a later call for fewer or as many
    demonstrations reads them back without computing (the store is not rewritten)."""
    rid = "pr99"
    got = get_demos(tiny_catalog, [rid], 12, seed=3)[rid]
    region = tiny_catalog.region(rid)
    assert len(got) == 12
    for i, route in enumerate(got.routes):
        check = check_route(region, route, got.tourists, i)
        assert check.ok and check.score == pytest.approx(got.scores[i])
    path = demos_path(tiny_catalog.path)
    stamp = path.stat().st_mtime_ns
    again = get_demos(tiny_catalog, [rid], 8, seed=3)[rid]
    assert path.stat().st_mtime_ns == stamp
    assert again.routes == got.routes[:8]
    assert len(pd.read_parquet(path).query("region == @rid and seed == 3")) == 12


def test_actions_move_each_end_to_the_padded_end():
    """Routes of regions of several sizes become one action table whose end nodes are the
    padded instances' last node, padded with -1."""
    acts = actions([[0, 3, 5], [0, 2, 9, 11]], [6, 12], 14)
    assert acts.tolist() == [[0, 3, 13, -1], [0, 2, 9, 13]]


def test_inadmissible_demonstration_names_region_and_tourist(tiny_catalog):
    """A demonstration whose route the environment does not admit (here: a point visited
    twice) stops training with a UserError naming its region and tourist, never skipped."""
    rid = "r199"
    demos = get_demos(tiny_catalog, [rid], 4, seed=1)[rid]
    routes = [list(r) for r in demos.routes]
    k = next(i for i, r in enumerate(routes) if len(r) > 3)
    routes[k] = routes[k][:2] + routes[k][1:]
    bad = Demonstrations(demos.tourists, routes, demos.scores)
    cfg = TrainConfig(regions=[rid], epochs=1, demos=4, imitation_epochs=3, imitation_batch=8,
                      val_every=0, val_tourists=2, checkpoint_every=0, threads=1,
                      device="cpu", seed=1)
    tourist = int(demos.tourists.tourist_id[k])
    with pytest.raises(UserError, match=f"demonstration of {rid} tourist {tourist}"):
        train(cfg, tiny_catalog, demos={rid: bad})


def test_demonstrations_check_their_lengths():
    """Demonstrations hold one route and one score per tourist."""
    t = Tourists("x", np.arange(2), "generated", np.zeros((2, 2)), np.zeros(2), np.ones(2),
                 np.zeros((2, 4)))
    with pytest.raises(ValueError, match="one of each per tourist"):
        Demonstrations(t, [[0, 3]], np.zeros(2))


def test_reinforce_on_demonstration_tourists_with_their_routes(tiny_catalog):
    """With demo_tourists, REINFORCE epochs draw their tourists from the demonstrations and
    each one's ILS route joins its sampled routes (one rollout, given and sampled routes): the
    run trains with finite losses; demonstrations that nothing uses are refused."""
    from optw.train import MetricsHistory

    base = dict(regions=["pr99"], epochs=3, batch_size=4, tourists_per_epoch=2, val_every=0,
                val_tourists=2, checkpoint_every=0, threads=1, device="cpu", seed=4,
                demos=8)
    hist = MetricsHistory()
    result = train(TrainConfig(**base, demo_tourists=True), tiny_catalog, [hist])
    assert result.epochs == 3 and all(np.isfinite(m["loss"]) for m in hist.epochs)
    with pytest.raises(ValueError, match="demonstrations are used by"):
        TrainConfig(**base)
