"""Packs: per-region models trained side by side in one batched step (optw.train.pack), the
stacked network and decoder behind them, and padded batches of several regions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench_pack_memory import saved_bytes
from optw.catalog import sample_tourists
from optw.decode import rollout
from optw.env import NEVER, make_instances, reset, stack_instances
from optw.model import ModelConfig, PointerNet
from optw.model.stacked import StackedPointerNet
from optw.train import Checkpointer, MetricsHistory, TrainConfig, train
from optw.train.pack import train_pack

# regions of different sizes (102, 50 and 102 nodes), so packs pad
REGIONS = ["c101", "pr01", "r102"]


def _configs(epochs=(4, 4, 4), **kw) -> list[TrainConfig]:
    base = dict(batch_size=8, val_every=2, val_tourists=4, checkpoint_every=0, threads=1)
    return [TrainConfig(regions=[r], epochs=e, seed=10 + i, **{**base, **kw})
            for i, (r, e) in enumerate(zip(REGIONS, epochs, strict=True))]


def _seeded_models(n: int) -> list[PointerNet]:
    """``n`` untrained models, model i seeded with i."""
    models = []
    for i in range(n):
        torch.manual_seed(i)
        models.append(PointerNet(ModelConfig()))
    return models


def _max_diff(a: PointerNet, b: PointerNet) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    return max(float((sa[k] - sb[k]).abs().max()) for k in sa)


def test_padded_instances_change_nothing(catalog):
    """stack_instances: padding nodes sit before the end node and are never admissible, so a
    tourist padded into a bigger batch gets the same sampled routes, log-probabilities and
    rewards as alone (end node renumbered)."""
    small, big = catalog.region("pr01"), catalog.region("c101")
    rng = np.random.default_rng(0)
    a = make_instances(small, sample_tourists(small, 2, rng, None))
    b = make_instances(big, sample_tourists(big, 1, rng, None))
    both = stack_instances([a, b])
    assert both.n_nodes == b.n_nodes and both.n_tourists == 3
    pad = slice(a.n_nodes - 1, both.n_nodes - 1)
    assert bool((both.node_u[:2, pad, 3] == NEVER).all())
    assert not bool(reset(both).mask[:2, pad].any())
    torch.manual_seed(0)
    model = PointerNet(ModelConfig())
    ids = torch.arange(2).repeat_interleave(8)
    alone = rollout(model, a, ids, generator=torch.Generator().manual_seed(1))
    padded = rollout(model, both, ids, generator=torch.Generator().manual_seed(1))
    routes = padded.routes[:, :alone.routes.shape[1]].clone()
    routes[routes == both.end] = a.end
    assert torch.equal(routes, alone.routes)
    assert torch.equal(padded.reward, alone.reward)
    assert torch.allclose(padded.log_prob, alone.log_prob, atol=1e-5)


@pytest.mark.parametrize("small_norm_weight", [False, True])
def test_stacked_rollout_matches_each_model_alone(catalog, small_norm_weight):
    """One rollout of a StackedPointerNet over three regions' tourists samples, member by
    member, exactly the routes each model samples alone with the same generator, with the same
    log-probabilities and entropies (within rounding) and the same gradients; also when a
    layer-norm weight is near 0 (its backward then keeps the normalised rows instead of
    recovering them from the output)."""
    regions = [catalog.region(r) for r in REGIONS]
    models = _seeded_models(len(regions))
    if small_norm_weight:
        with torch.no_grad():
            models[1].layers[0].norm2.weight[5] = 0.01
    stacked = StackedPointerNet(models)
    k, b = 2, 8
    parts = [make_instances(r, sample_tourists(r, k, np.random.default_rng(i), None))
             for i, r in enumerate(regions)]
    alone = [rollout(m, inst, torch.arange(k).repeat_interleave(b),
                     generator=torch.Generator().manual_seed(10 + i))
             for i, (m, inst) in enumerate(zip(models, parts, strict=True))]
    inst = stack_instances(parts)
    out = rollout(stacked, inst, torch.arange(3 * k).repeat_interleave(b),
                  generator=[torch.Generator().manual_seed(10 + i) for i in range(3)],
                  member=torch.arange(3).repeat_interleave(k))
    for i, (a, part) in enumerate(zip(alone, parts, strict=True)):
        rows = slice(i * k * b, (i + 1) * k * b)
        routes = out.routes[rows, :a.routes.shape[1]].clone()
        routes[routes == inst.end] = part.end
        assert torch.equal(routes, a.routes), REGIONS[i]
        assert torch.equal(out.reward[rows], a.reward)
        assert torch.allclose(out.log_prob[rows], a.log_prob, atol=1e-4)
        assert torch.allclose(out.entropy[rows], a.entropy, atol=1e-4)
    sum(a.log_prob.sum() for a in alone).backward()
    out.log_prob.sum().backward()
    for name, w in zip(stacked.names, stacked.weights, strict=True):
        for i, m in enumerate(models):
            g = dict(m.named_parameters())[name].grad
            assert torch.allclose(w.grad[i], g, rtol=1e-3, atol=1e-3 * float(g.abs().max())), name
    assert _max_diff(stacked.member(1), models[1]) == 0.0


def test_batched_products_equal_the_per_member_ones(catalog, monkeypatch):
    """The GPU's way of multiplying every member's rows (one batched product over a padded
    table, made and dropped inside the product and again in its backward), run on the CPU,
    gives the per-member products' logits and gradients: guards the GPU-only branch here."""
    from optw.model import stacked as stacked_module

    regions = [catalog.region(r) for r in REGIONS]
    models = _seeded_models(len(regions))
    parts = [make_instances(r, sample_tourists(r, 2, np.random.default_rng(i), None))
             for i, r in enumerate(regions)]
    inst = stack_instances(parts)
    outs = []
    for batched in (False, True):
        monkeypatch.setattr(stacked_module, "_batched", lambda x, b=batched: b)
        net = StackedPointerNet(models)
        out = rollout(net, inst, torch.arange(6).repeat_interleave(4),
                      generator=[torch.Generator().manual_seed(10 + i) for i in range(3)],
                      member=torch.arange(3).repeat_interleave(2))
        (out.log_prob.sum() + out.entropy.sum()).backward()
        outs.append((out, [w.grad for w in net.weights]))
    (a, ga), (b, gb) = outs
    assert torch.equal(a.routes, b.routes)
    assert torch.allclose(a.log_prob, b.log_prob, atol=1e-5)
    for name, x, y in zip(StackedPointerNet(models).names, ga, gb, strict=True):
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-5 * float(x.abs().max()) + 1e-8), name


def test_a_pack_keeps_about_its_members_own_activations(catalog):
    """The stacked network keeps its rows packed for the backward: a pack's rollout of three
    regions of different sizes keeps at most 1.3x the bytes its members keep alone (a padded
    [members, widest member's rows] table per block kept 1.8x here, and 4x on 16 Solomon
    regions with trained weights)."""
    regions = [catalog.region(r) for r in REGIONS]
    models = _seeded_models(len(regions))
    k, b = 2, 8
    parts = [make_instances(r, sample_tourists(r, k, np.random.default_rng(i), None))
             for i, r in enumerate(regions)]
    alone = sum(saved_bytes(lambda m=m, inst=inst, i=i: rollout(
        m, inst, torch.arange(k).repeat_interleave(b),
        generator=torch.Generator().manual_seed(10 + i)))[0]
        for i, (m, inst) in enumerate(zip(models, parts, strict=True)))
    pack, _ = saved_bytes(lambda: rollout(
        StackedPointerNet(models), stack_instances(parts), torch.arange(3 * k).repeat_interleave(b),
        generator=[torch.Generator().manual_seed(10 + i) for i in range(3)],
        member=torch.arange(3).repeat_interleave(k)))
    assert pack <= 1.3 * alone, (pack, alone)


def test_pack_trains_the_same_models_as_alone(catalog):
    """train_pack equals train() of each region alone with the same seeds: the same sampled
    routes every epoch (equal mean rewards), the same validations, and weights equal within
    rounding (Adam normalises each step, so differences scale with the learning rate: runs
    on other routes differ by about lr per step, these by a small fraction of it). A member
    with a smaller budget leaves the batch when done and is not stepped again; seed 11 has an
    epoch where every pr01 route is forced (nothing to learn: alone, Adam skips the step)."""
    configs = _configs(epochs=(4, 4, 2))
    hist_alone = [MetricsHistory() for _ in configs]
    hist_pack = [MetricsHistory() for _ in configs]
    alone = [train(c, catalog, [h]) for c, h in zip(configs, hist_alone, strict=True)]
    pack = train_pack(configs, catalog, [[h] for h in hist_pack])
    for i, (a, p) in enumerate(zip(alone, pack, strict=True)):
        assert p.epochs == a.epochs == configs[i].epochs
        ra = [e["mean_reward"] for e in hist_alone[i].epochs]
        rp = [e["mean_reward"] for e in hist_pack[i].epochs]
        assert ra == pytest.approx(rp, abs=1e-4), REGIONS[i]
        assert [v["val_score"] for v in hist_alone[i].validations] == pytest.approx(
            [v["val_score"] for v in hist_pack[i].validations])
        assert _max_diff(a.model, p.model) < 0.5 * configs[i].lr, REGIONS[i]


def test_pack_resumes_exactly_and_members_resume_alone(catalog, tmp_path):
    """A pack stopped after 2 epochs and resumed from its members' checkpoints ends with
    exactly the weights of the uninterrupted pack; a member's pack checkpoint is an ordinary
    training checkpoint that train() resumes alone."""
    full = train_pack(_configs(), catalog)
    short = _configs(epochs=(2, 2, 2))
    ckpts = [Checkpointer(tmp_path / r, every=2, keep_best=False) for r in REGIONS]
    train_pack(short, catalog, [[c] for c in ckpts])
    resumed = train_pack(_configs(), catalog, resumes=[c.last for c in ckpts])
    for f, r in zip(full, resumed, strict=True):
        assert _max_diff(f.model, r.model) == 0.0
        assert f.last_validation["val_score"] == r.last_validation["val_score"]
    alone = train(_configs()[0], catalog, resume=ckpts[0].last)
    assert alone.epochs == 4
    assert _max_diff(alone.model, full[0].model) < 0.5 * short[0].lr


def test_pack_refuses_what_it_cannot_batch(catalog):
    """A pack member must be a per-region model that trains with the compacted rollout, and
    members share the model shape."""
    with pytest.raises(ValueError, match="per-region models"):
        train_pack([TrainConfig(regions=["c101", "r102"], epochs=1)], catalog)
    with pytest.raises(ValueError, match="member 0: rollout = 'static'"):
        train_pack([TrainConfig(regions=["c101"], epochs=1, rollout="static")], catalog)
    configs = _configs()
    configs[1] = configs[1].replace(model={"n_layers": 1})
    with pytest.raises(ValueError, match="another model config"):
        train_pack(configs, catalog)


def test_global_model_trains_on_mixed_region_batches(catalog):
    """mix_regions: each tourist of a step comes from its own region, all in one padded batch;
    the global model trains on it and validates on every region."""
    config = TrainConfig(regions=["pr01", "c101"], epochs=3, batch_size=4, tourists_per_epoch=4,
                         mix_regions=True, val_every=0, val_tourists=2, checkpoint_every=0,
                         threads=1, seed=3)
    hist = MetricsHistory()
    result = train(config, catalog, [hist])
    assert result.epochs == 3 and len(hist.epochs) == 3
    assert {"val_score/pr01", "val_score/c101"} <= set(result.last_validation)
    with pytest.raises(ValueError, match="mix_regions"):
        TrainConfig(regions=["pr01"], mix_regions="yes")


def test_a_pack_copies_a_member_out_only_to_validate_or_finish(catalog, monkeypatch):
    """A pack's epoch builds no plain copy of its members (``StackedPointerNet.member``:
    ~16 ms each on a CPU, and host-device copies on a GPU, which halved a GPU's packs of 56):
    only a validating epoch and the finish copy a member out."""
    calls = []
    real = StackedPointerNet.member
    monkeypatch.setattr(StackedPointerNet, "member",
                        lambda self, p: calls.append(p) or real(self, p))
    train_pack(_configs(epochs=(4, 4, 4), val_every=0), catalog)
    assert sorted(calls) == [0, 0, 1, 1, 2, 2]  # the last epoch's validation, the finish
