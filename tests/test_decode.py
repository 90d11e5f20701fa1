"""Tests of optw.decode: published outputs, solve() methods, rollouts, the CLI."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_names_field, bad_tourists, good_tourist
from optw.catalog import Tourists
from optw.cli import main
from optw.decode import beam_search, rollout, solve
from optw.env import check_route, make_instances
from optw.model import ModelConfig, PointerNet, load_model, save_model

PRETRAINED = Path(__file__).resolve().parents[2] / "shared" / "reference" / "pretrained"
PR01 = PRETRAINED / "pr01_uni_samp_500000.pt"
T101 = PRETRAINED / "t101_corr_samp_500000.pt"
needs_weights = pytest.mark.skipif(not PR01.exists(), reason="published weights not found")

PR01_BEAM = [0, 9, 24, 47, 12, 38, 30, 2, 32, 37, 10, 45, 11, 28, 1, 16, 36, 31, 35, 34, 22, 7]
T101_BEAM = [0, 68, 29, 8, 76, 3, 62, 7, 61, 16, 69, 17, 15, 33, 39, 44, 97, 46, 92, 74, 78]


@pytest.fixture(scope="module")
def published():
    return {"pr01": load_model(PR01), "t101": load_model(T101)}


@pytest.fixture(scope="module")
def untrained():
    torch.manual_seed(123)
    return PointerNet(ModelConfig()).eval()


@needs_weights
@pytest.mark.parametrize("region_id,score,route", [("pr01", 308, PR01_BEAM),
                                                    ("t101", 399, T101_BEAM)])
def test_published_beam_search_outputs(catalog, published, region_id, score, route):
    """Beam search 128 in published-outputs mode reproduces the authors' benchmark routes
    (pr01 -> 308, t101 -> 399)."""
    region = catalog.region(region_id)
    sol = solve(published[region_id], region, catalog.benchmark(region_id), "beam", beams=128,
                keep_greedy=False)[0]
    assert sol.score == score
    assert sol.route == route + [region.n_nodes - 1]


@needs_weights
def test_published_greedy_is_repeatable(catalog, published):
    """Greedy decoding of the t101 benchmark tourist gives 397, identically on every call."""
    region = catalog.region("t101")
    runs = [solve(published["t101"], region, catalog.benchmark("t101"), "greedy")[0]
            for _ in range(2)]
    assert runs[0].score == 397 and runs[0].route == runs[1].route


@needs_weights
def test_batching_does_not_change_beam_results(catalog, published):
    """Beam search batched over tourists finds the same routes as run one tourist at a time
    (compaction itself is checked against a full-graph reference in test_model.py)."""
    region = catalog.region("pr01")
    tourists = catalog.validation("pr01")[:3]
    inst = make_instances(region, tourists)
    batched = beam_search(published["pr01"], inst, 16)
    for k in range(len(tourists)):
        single = beam_search(published["pr01"], make_instances(region, tourists[k]), 16)
        assert single.routes[0] == batched.routes[k]
        assert single.log_probs[0] == pytest.approx(batched.log_probs[k], abs=1e-4)


def test_beam_with_keep_greedy_is_never_below_greedy(catalog, untrained):
    """With keep_greedy (the default), beam search and sampling are never below greedy, on an
    untrained model and several tourists of three groups."""
    for region_id in ("c101", "pr01", "t201"):
        region = catalog.region(region_id)
        tourists = catalog.validation(region_id)[:6]
        greedy = solve(untrained, region, tourists, "greedy")
        for method, kw in (("beam", {"beams": 4}), ("sampling", {"samples": 4})):
            other = solve(untrained, region, tourists, method, **kw)
            for g, b in zip(greedy, other, strict=True):
                assert b.score >= g.score - 1e-9


def test_keep_greedy_reuses_given_greedy_solutions(catalog, untrained):
    """Beam search and sampling given the batch's greedy solutions (an evaluation that reports
    greedy too) return the routes and scores they find decoding greedy themselves, with the
    greedy seconds added; greedy solutions of other tourists are refused, naming the argument."""
    region = catalog.region("t201")
    tourists = catalog.validation("t201")[:5]
    greedy = solve(untrained, region, tourists, "greedy")
    for method, kw in (("beam", {"beams": 4}), ("sampling", {"samples": 4})):
        own = solve(untrained, region, tourists, method, **kw)
        given = solve(untrained, region, tourists, method, greedy=greedy, **kw)
        assert [s.route for s in given] == [s.route for s in own]
        assert [s.score for s in given] == [s.score for s in own]
        assert all(s.seconds >= greedy[0].seconds for s in given)
    with pytest.raises(ValueError, match="greedy: one greedy solution per tourist"):
        solve(untrained, region, tourists[:3], "beam", beams=2, greedy=greedy)


def test_every_method_returns_valid_solutions(catalog, untrained):
    """Every method returns one validated Solution per tourist with a consistent schedule."""
    region = catalog.region("t101")
    tourists = catalog.validation("t101")[:3]
    for method, kw in (("greedy", {}), ("sampling", {"samples": 8}), ("beam", {"beams": 8}),
                       ("active_search", {"epochs": 2, "batch_size": 4, "beams": 4})):
        sols = solve(untrained, region, tourists, method, **kw)
        assert [s.tourist for s in sols] == tourists.tourist_id.tolist()
        for k, s in enumerate(sols):
            check = check_route(region, s.route, tourists, k, claimed_score=s.score)
            assert check.ok and s.method == method and s.seconds > 0
            assert len(s.arrival) == len(s.route) == len(s.start)


def test_bad_arguments_raise_clear_errors(catalog, untrained):
    """Unknown methods and bad sample counts raise a UserError naming them; a beam width is
    checked where it enters (``check_beams``: the CLI, the planner, the pyfunc, evaluation
    settings), and beam search itself refuses a width below 1."""
    region = catalog.region("pr01")
    tourists = catalog.benchmark("pr01")
    with pytest.raises(ValueError, match="beam width 0"):
        solve(untrained, region, tourists, "beam", beams=0)
    with pytest.raises(ValueError, match="unknown method 'dfs'"):
        solve(untrained, region, tourists, "dfs")
    with pytest.raises(ValueError, match="samples"):
        solve(untrained, region, tourists, "sampling", samples=0)


def test_tourist_with_no_reachable_point_gets_the_empty_route(catalog, untrained):
    """A tourist whose window is too short for any visit gets [0, n-1] with score 0, by every
    method, and the rollout gives it log-probability 0."""
    region = catalog.region("c101")
    bench = catalog.benchmark("c101")
    short = Tourists("c101", np.array([5]), "file", bench.start_xy, np.array([100.0]),
                     np.array([100.5]), bench.scores)
    for method in ("greedy", "sampling", "beam"):
        sol = solve(untrained, region, short, method, beams=8, samples=4)[0]
        assert sol.route == [0, region.n_nodes - 1] and sol.score == 0
    out = rollout(untrained, make_instances(region, short), greedy=True)
    assert out.log_prob.item() == 0 and out.routes.tolist() == [[0, region.n_nodes - 1]]
    trainable = PointerNet(ModelConfig())
    out = rollout(trainable, make_instances(region, short), torch.zeros(4, dtype=torch.long))
    (out.log_prob.sum() + out.entropy.sum()).backward()  # a training step stays valid


def test_rollout_for_training(catalog):
    """rollout() samples R routes over shared instances (ids), reproducibly for a seeded
    generator, with rewards equal to the route scores and a differentiable summed log-prob
    and entropy."""
    region = catalog.region("pr01")
    tourists = catalog.validation("pr01")[:2]
    inst = make_instances(region, tourists)
    torch.manual_seed(0)
    model = PointerNet()
    ids = torch.arange(2).repeat_interleave(8)
    out = rollout(model, inst, ids, generator=torch.Generator().manual_seed(5))
    again = rollout(model, inst, ids, generator=torch.Generator().manual_seed(5))
    assert torch.equal(out.routes, again.routes)
    assert out.routes.shape[0] == 16 and out.log_prob.requires_grad and out.entropy.requires_grad
    for r in range(16):
        route = [v for v in out.routes[r].tolist() if v >= 0]
        check = check_route(region, route, tourists, int(ids[r]))
        assert check.ok and out.reward[r].item() == pytest.approx(check.score, rel=1e-5)
        assert out.lengths[r] == len(route)
    baseline = out.reward.view(2, 8).mean(1).repeat_interleave(8)
    loss = -((out.reward - baseline) * out.log_prob).mean() - 0.01 * out.entropy.mean()
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def _rollout_with_grads(model, inst, ids, mode, seed=3):
    from optw.decode import Rollout
    from optw.decode.static import static_rollout

    model.zero_grad()
    gen = torch.Generator().manual_seed(seed)
    if mode == "static":
        out = Rollout.of(inst, ids, *static_rollout(model, inst, ids, generator=gen))
    else:
        out = rollout(model, inst, ids, generator=gen)
    (out.log_prob.sum() + out.entropy.sum()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return out, grads, gen.get_state()


@pytest.mark.parametrize("weights", ["published", "untrained"])
def test_static_rollout_equals_the_compacted_one(catalog, published, untrained, weights):
    """The static-shape rollout (every node a row, done mask; GPUs) samples the same routes as
    the compacted decoder from the same generator, consuming the same random numbers, with
    log-probs, entropies and gradients equal within float rounding; greedy routes are equal."""
    from optw.decode.static import static_rollout

    if weights == "published" and not T101.exists():
        pytest.skip("published weights not found")
    model = published["t101"] if weights == "published" else untrained
    region = catalog.region("t101")
    inst = make_instances(region, catalog.validation("t101")[:2])
    ids = torch.arange(2).repeat_interleave(16)
    compact, g_compact, rng_compact = _rollout_with_grads(model, inst, ids, "compact")
    static, g_static, rng_static = _rollout_with_grads(model, inst, ids, "static")
    assert torch.equal(compact.routes, static.routes)
    assert torch.equal(rng_compact, rng_static)
    assert torch.equal(compact.reward, static.reward)
    assert torch.allclose(compact.log_prob, static.log_prob, atol=1e-4)
    assert torch.allclose(compact.entropy, static.entropy, atol=1e-4)
    for a, b in zip(g_compact, g_static, strict=True):
        assert torch.allclose(a, b, atol=1e-3, rtol=1e-3)
    with torch.inference_mode():
        greedy = rollout(model, inst, greedy=True)
        routes, log_prob, _ = static_rollout(model, inst, torch.arange(2), greedy=True)
    assert torch.equal(greedy.routes, routes)
    assert torch.allclose(greedy.log_prob, log_prob, atol=1e-4)


def test_static_rollout_on_padded_regions(catalog, untrained):
    """On tourists of two regions padded to one node count, the static rollout equals the
    compacted one."""
    from optw.env import stack_instances

    parts = [make_instances(catalog.region(r), catalog.validation(r)[:1]) for r in
             ("pr01", "c101")]
    inst = stack_instances(parts)
    ids = torch.arange(2).repeat_interleave(4)
    a, _, _ = _rollout_with_grads(untrained, inst, ids, "compact")
    b, _, _ = _rollout_with_grads(untrained, inst, ids, "static")
    assert torch.equal(a.routes, b.routes)


def test_fixed_step_rollout_draws_valid_routes_without_host_syncs(catalog, published,
                                                                  untrained):
    """The fixed-step static rollout with Gumbel sampling (what a CUDA graph captures,
    rollout "graph") draws valid routes whose rewards are their scores, reproducibly from a
    seeded generator, the same routes with more steps (untrimmed, -1 after the end); with
    too few steps ``all_done`` says a route was cut short. What a capture holds (rollout,
    reward, loss, backward) never reads a value back. ``graph_steps`` leaves headroom and
    never exceeds n."""
    from torch.profiler import profile

    from optw.decode.core import route_reward
    from optw.decode.reinforce import reinforce_loss
    from optw.decode.static import all_done, static_rollout
    from optw.train.graphed import graph_steps

    model = published["t101"] if T101.exists() else untrained
    region = catalog.region("t101")
    tourists = catalog.validation("t101")[:2]
    inst = make_instances(region, tourists)
    ids = torch.arange(2).repeat_interleave(8)

    def free(steps):
        with torch.no_grad():
            return static_rollout(model, inst, ids, generator=torch.Generator().manual_seed(4),
                                  sampling="free", steps=steps)

    full, lp, ent = free(inst.n_nodes)
    longest = int((full >= 0).sum(1).max()) - 1
    steps = graph_steps(longest, inst.n_nodes)
    routes, lp2, ent2 = free(steps)
    assert bool(all_done(routes, inst.end)) and routes.shape == (16, inst.n_nodes + 1)
    assert torch.equal(routes, full) and torch.allclose(lp, lp2) and torch.allclose(ent, ent2)
    assert not bool(all_done(free(longest - 1)[0], inst.end))
    reward = route_reward(inst, ids, routes)
    for r in range(16):
        check = check_route(region, [v for v in routes[r].tolist() if v >= 0], tourists,
                            int(ids[r]))
        assert check.ok and float(reward[r]) == pytest.approx(check.score, rel=1e-5)
    # after a first pass: the CPU's layer norm checks its weights once per weight version
    for record in (False, True):
        with profile() if record else contextlib.nullcontext() as prof:
            routes, lp, ent = static_rollout(untrained, inst, ids, sampling="free",
                                             steps=steps)
            reinforce_loss(route_reward(inst, ids, routes), lp, ent, 8, 0.1).loss.backward()
    syncs = {"aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::nonzero"}
    assert not [e.name for e in prof.events() if e.name in syncs]
    assert longest < steps <= inst.n_nodes
    assert [graph_steps(k, 500) for k in (10, 15, 16, 499)] == [12, 16, 20, 500]


def test_training_rollout_choice():
    """``choose_rollout``: ``auto`` is static on CUDA up to STATIC_MAX_ROWS node rows, else
    compact; ``graph`` (CUDA only, refused elsewhere naming the setting) goes static above
    GRAPH_MAX_ROWS and compact above STATIC_MAX_ROWS; an explicit setting wins; an unknown
    one is refused where settings are read (``TrainConfig``)."""
    from optw.errors import ConfigError
    from optw.train import TrainConfig
    from optw.train.rollouts import choose_rollout

    assert choose_rollout("auto", "cpu", 32 * 102) == "compact"
    assert choose_rollout("auto", "cuda", 32 * 102) == "static"
    assert choose_rollout("auto", "cuda", 64 * 32 * 102) == "compact"  # too many rows to keep
    assert choose_rollout("graph", "cuda", 32 * 102) == "graph"
    assert choose_rollout("graph", "cuda", 512 * 102) == "static"  # compute-bound
    assert choose_rollout("graph", "cuda", 64 * 32 * 102) == "compact"
    assert choose_rollout("compact", "cuda", 32 * 102) == "compact"
    assert choose_rollout("static", "cpu", 32 * 102) == "static"
    with pytest.raises(ValueError, match="rollout = graph .* needs a CUDA device"):
        choose_rollout("graph", "cpu", 32)
    with pytest.raises(ConfigError, match="rollout = 'dense': must be one of"):
        TrainConfig(regions=["t101"], rollout="dense")


def test_teacher_forcing_gives_the_sampled_routes_log_probs(catalog, published, untrained):
    """Forcing the routes a rollout sampled (``actions``) gives back those routes, and their
    log-probabilities equal the sampling rollout's within float rounding, for a single
    model, tourists of several regions padded into one batch, and a pack of two models; an
    action that is not admissible raises ForcedActionError naming the route and step."""
    from optw.decode.core import ForcedActionError
    from optw.env import stack_instances
    from optw.model.stacked import StackedPointerNet

    model = published["t101"] if T101.exists() else untrained
    inst = make_instances(catalog.region("t101"), catalog.validation("t101")[:3])
    mixed = stack_instances([make_instances(catalog.region(r), catalog.validation(r)[:2])
                             for r in ("pr01", "c101", "t101")])
    for net, batch in ((model, inst), (untrained, mixed)):
        ids = torch.arange(batch.n_tourists).repeat_interleave(4)
        with torch.no_grad():
            out = rollout(net, batch, ids, generator=torch.Generator().manual_seed(2))
            forced = rollout(net, batch, ids, actions=out.routes)
        assert torch.equal(forced.routes, out.routes)
        assert torch.allclose(forced.log_prob, out.log_prob, atol=1e-5)
    torch.manual_seed(1)
    pack = StackedPointerNet([PointerNet(), PointerNet()]).eval()
    member = torch.tensor([0, 0, 1])
    ids = torch.arange(3).repeat_interleave(2)
    gens = [torch.Generator().manual_seed(s) for s in (3, 4)]
    with torch.no_grad():
        out = rollout(pack, inst, ids, generator=gens, member=member)
        forced = rollout(pack, inst, ids, member=member, actions=out.routes)
    assert torch.equal(forced.routes, out.routes)
    assert torch.allclose(forced.log_prob, out.log_prob, atol=1e-5)
    bad = out.routes.clone()
    bad[1, 1] = 0  # the start again
    with pytest.raises(ForcedActionError, match="route 1: node 0 at step 1"):
        rollout(model, inst, ids, actions=bad)


def test_active_search_leaves_the_model_untouched(catalog, untrained):
    """Active search tunes a copy: the caller's weights do not change, and its answer is at
    least the greedy route's score."""
    region = catalog.region("pr01")
    tourists = catalog.benchmark("pr01")
    before = {k: v.clone() for k, v in untrained.state_dict().items()}
    sol = solve(untrained, region, tourists, "active_search", epochs=3, batch_size=4, beams=4)[0]
    greedy = solve(untrained, region, tourists, "greedy")[0]
    assert sol.score >= greedy.score
    for k, v in untrained.state_dict().items():
        assert torch.equal(v, before[k])


@needs_weights
def test_cli_solves_with_published_weights(capsys):
    """`optw solve` takes the authors' .pt unchanged and prints one JSON object per tourist."""
    assert main(["solve", "--region", "pr01", "--checkpoint", str(PR01), "--published",
                 "--beams", "128", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.strip())
    assert row["score"] == 308 and row["route"][:3] == [0, 9, 24] and row["method"] == "beam"
    assert set(row) == {"region", "tourist", "method", "route", "score", "seconds"}


@needs_weights
def test_cli_reads_tourist_files_and_reports_bad_ones(tmp_path, capsys, catalog):
    """Tourist files (object or list, scores per point) are solved; a missing field or
    T_end <= T_start is reported by name; a bad beam width is an error."""
    region = catalog.region("pr01")
    good = {"start": [0.0, 0.0], "t_start": 0, "t_end": 600, "scores": [1] * region.n_points}
    path = tmp_path / "t.json"
    path.write_text(json.dumps([good, {**good, "t_end": 300}]))
    assert main(["solve", "--region", "pr01", "--checkpoint", str(PR01), "--greedy",
                 "--tourist", str(path)]) == 0
    assert capsys.readouterr().out.count("route:") == 2
    for bad, field in (({k: v for k, v in good.items() if k != "t_end"}, "t_end"),
                       ({**good, "t_end": 0}, "t_end"),
                       ({**good, "scores": [1, 2]}, "scores")):
        path.write_text(json.dumps(bad))
        assert main(["solve", "--region", "pr01", "--checkpoint", str(PR01),
                     "--tourist", str(path)]) == 2
        assert field in capsys.readouterr().err
    assert main(["solve", "--region", "pr01", "--checkpoint", str(PR01), "--beams", "200"]) == 2
    assert "beam width" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """An untrained model file (tourist-file tests need no trained weights)."""
    torch.manual_seed(5)
    return save_model(PointerNet(ModelConfig()), tmp_path_factory.mktemp("ckpt") / "m.pt")


def _solve_file(tiny_catalog, checkpoint: Path, path: Path, *extra: str) -> int:
    return main(["solve", "--region", "r199", "--checkpoint", str(checkpoint), "--catalog",
                 str(tiny_catalog.path), "--tourist", str(path), *extra])


def test_cli_tourist_file_echoes_string_ids(tmp_path, capsys, tiny_catalog, tiny_checkpoint):
    """Tourist ids in a file may be strings: `optw solve` echoes "alice" (and integer ids, and
    the position of a tourist without id) in its JSON and text output, for a list and for a
    {"tourists": [...]} file."""
    region = tiny_catalog.region("r199")
    good = good_tourist(region)
    tourists = [good, {**good, "tourist": 7}, {k: v for k, v in good.items() if k != "tourist"}]
    path = tmp_path / "t.json"
    for data in (tourists, {"tourists": tourists}):
        path.write_text(json.dumps(data))
        assert _solve_file(tiny_catalog, tiny_checkpoint, path, "--greedy", "--json") == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [r["tourist"] for r in rows] == ["alice", 7, 2]
    assert _solve_file(tiny_catalog, tiny_checkpoint, path, "--beams", "2") == 0
    assert "r199 tourist alice (beam search 2)" in capsys.readouterr().out


def test_cli_rejects_each_generated_bad_tourist_file(tmp_path, capsys, tiny_catalog,
                                                     tiny_checkpoint):
    """Every tourist of the generated bad family, alone in a file or second in a
    {"tourists": [...]} file, makes `optw solve` exit 2 with one line on stderr naming the file
    and the field, printing and writing nothing; a bad outer format and a missing file say so."""
    region = tiny_catalog.region("r199")
    path = tmp_path / "t.json"
    for case, bad, field in bad_tourists(region):
        for data in (bad, {"tourists": [good_tourist(region), bad]}):
            path.write_text(json.dumps(data))
            assert _solve_file(tiny_catalog, tiny_checkpoint, path) == 2, case
            out, err = capsys.readouterr()
            assert out == "" and str(path) in err, case
            assert_names_field(err, field)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]
    for data, field in (({"tourists": [], "x": 1}, "tourists"), ({"tourists": []}, "tourists"),
                        (5, "tourists"), ([5], "tourist")):
        path.write_text(json.dumps(data))
        assert _solve_file(tiny_catalog, tiny_checkpoint, path) == 2
        assert_names_field(capsys.readouterr().err, field)
    assert _solve_file(tiny_catalog, tiny_checkpoint, tmp_path / "all") == 2
    assert "benchmark, validation, paper or a tourist JSON file" in capsys.readouterr().err


def test_cli_bad_tourist_file_is_one_line_without_traceback(tmp_path, tiny_catalog,
                                                             tiny_checkpoint):
    """Through the real command line (a subprocess), a tourist file with a NaN score ends with
    exit code 2 and one line naming the field, no traceback."""
    region = tiny_catalog.region("r199")
    path = tmp_path / "t.json"
    path.write_text(json.dumps({**good_tourist(region), "scores": [float("nan")] * 10}))
    proc = subprocess.run(
        [sys.executable, "-m", "optw.cli", "solve", "--region", "r199", "--checkpoint",
         str(tiny_checkpoint), "--catalog", str(tiny_catalog.path), "--tourist", str(path)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "scores[0]:" in proc.stderr



def _beam_literals(path: Path) -> list[str]:
    """Beam-width constants written outside optw.decode.limits: ``*BEAMS = <number>`` and
    ``beams``/``width`` parameters whose default is a number."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            found += [f"{path.name}:{node.lineno} {t.id}" for t in node.targets
                      if isinstance(t, ast.Name) and t.id.endswith("BEAMS")]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            args = a.posonlyargs + a.args
            pairs = [*zip(args[len(args) - len(a.defaults):], a.defaults, strict=True),
                     *zip(a.kwonlyargs, a.kw_defaults, strict=True)]
            found += [f"{path.name}:{node.lineno} {node.name}({arg.arg}={d.value})"
                      for arg, d in pairs if arg.arg in ("beams", "width", "beam_width")
                      and isinstance(d, ast.Constant) and isinstance(d.value, int)]
    return found


def test_beam_widths_have_one_home():
    """Beam-width bounds and defaults come only from optw.decode.limits: no module of the
    package writes its own MAX_BEAMS or a numeric beams/width default (RegionSolver once said
    16, beam.py 128); solve, beam search and active search default to PAPER_BEAMS; the
    registry's solver passes None on, and the pyfunc alone applies SERVE_BEAMS (one place);
    check_beams takes MIN_BEAMS..MAX_BEAMS;
    Solution.tourist may hold a caller's string id."""
    import inspect
    import typing

    from optw.decode import active_search, check_beams, limits
    from optw.decode.solve import Solution
    from optw.tracking import RegionSolver

    package = Path(__file__).resolve().parents[1] / "platform" / "optw"
    offenders = [hit for p in sorted(package.rglob("*.py"))
                 if p != package / "decode" / "limits.py" for hit in _beam_literals(p)]
    assert offenders == []
    for fn, name in ((solve, "beams"), (active_search, "beams"), (beam_search, "width")):
        assert inspect.signature(fn).parameters[name].default == limits.PAPER_BEAMS
    for method in (RegionSolver.solve, RegionSolver.predict):
        assert inspect.signature(method).parameters["beams"].default is None
    assert check_beams(limits.MIN_BEAMS) == limits.MIN_BEAMS
    assert check_beams(limits.MAX_BEAMS) == limits.MAX_BEAMS
    for bad in (limits.MIN_BEAMS - 1, limits.MAX_BEAMS + 1):
        with pytest.raises(ValueError, match=f"{limits.MIN_BEAMS}..{limits.MAX_BEAMS}"):
            check_beams(bad)
    assert typing.get_type_hints(Solution)["tourist"] == int | str


def test_decoder_lean_step_and_feature_table_match_the_environment(catalog, untrained):
    """The training rollout's lean child states (``env.visit``: ids, node, time, mask only)
    and the per-rollout integer feature table give exactly what ``step`` and
    ``dynamic_features`` give, over a few random admissible moves of 8 tourists (the decoder's
    shortcuts stay exact)."""
    from optw.decode.core import Decoder
    from optw.env import dynamic_features, reset, step

    region = catalog.region("t101")
    inst = make_instances(region, catalog.validation("t101")[:8])
    lean = Decoder(untrained, inst)
    full = reset(inst)
    full = step(inst, full, torch.zeros(8, dtype=torch.long))
    small = type(full)(full.ids, full.current, full.time_u, None, full.mask, None, None)
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        choice = full.mask.clone()
        choice[:, -1] = False
        live = choice.any(1).nonzero().squeeze(1)
        if not live.numel():
            break
        action = torch.multinomial(choice[live].float(), 1, generator=g).squeeze(1)
        full = step(inst, full.index(live), action, check=False)
        small = lean.child_state(small, live, action)
        for name in ("ids", "current", "time_u", "mask"):
            assert torch.equal(getattr(full, name), getattr(small, name)), name
        route, node = full.mask.nonzero(as_tuple=True)
        want = dynamic_features(inst, full)[route, node]
        assert torch.equal(lean.inputs(full, node, route)[2], want)


def test_normalised_advantages_weigh_every_tourist_alike():
    """Guards ``advantage = "normalised"``: each tourist's advantages are divided by its
    rewards' spread, so a tourist whose scores are ten times larger pulls no harder, a tourist
    whose routes all score alike adds nothing, and ``mean`` stays the paper's loss."""
    from optw.decode.reinforce import reinforce_loss

    log_prob = torch.randn(12, requires_grad=True)
    reward = torch.tensor([1.0, 2.0, 4.0, 1.0] + [10.0, 20.0, 40.0, 10.0] + [5.0] * 4)
    entropy = torch.zeros(12)
    loss = reinforce_loss(reward, log_prob, entropy, 4, advantage="normalised").loss
    (grad,) = torch.autograd.grad(loss, log_prob)
    assert torch.allclose(grad[:4], grad[4:8]) and bool((grad[8:] == 0).all())
    plain = reinforce_loss(reward, log_prob, entropy, 4).loss
    centred = reward.view(3, 4) - reward.view(3, 4).mean(1, keepdim=True)
    assert torch.allclose(plain, -(centred.view(-1) * log_prob).mean())
