"""Tests of optw.model: the network, the published-weights importer, model files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from optw.decode import rollout
from optw.env import dynamic_features, lookahead, make_instances, reset, step
from optw.model import (
    CheckpointError,
    ModelConfig,
    PointerNet,
    load_model,
    read_checkpoint,
    save_model,
)
from optw.model.fastops import (
    deferred_grads,
    embed,
    feed_forward,
    layer_norm,
    linear,
    pointer_logits,
)

PRETRAINED = Path(__file__).resolve().parents[2] / "shared" / "reference" / "pretrained"
PR01 = PRETRAINED / "pr01_uni_samp_500000.pt"
T101 = PRETRAINED / "t101_corr_samp_500000.pt"
needs_weights = pytest.mark.skipif(not PR01.exists(), reason="published weights not found")


def _authors_sd(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


class Reference:
    """The published network written directly from the authors' parameter layout (per-head
    ``x·W[h]`` projections, masked scores, full node set), independent of our model code."""

    def __init__(self, sd: dict):
        self.sd = sd

    def layer_norm(self, x, name):
        return F.layer_norm(x, (x.shape[-1],), self.sd[name + ".weight"], self.sd[name + ".bias"])

    def lin(self, x, name, bias=True):
        return F.linear(x, self.sd[name + ".weight"], self.sd.get(name + ".bias") if bias else None)

    def encode(self, x, rec, adj):
        for i in range(2):
            p = f"encoder.layers.{i}."
            a = p + "enc_self_attn."
            heads = []
            for h in range(self.sd[a + "attention.w_q"].shape[0]):
                q = x @ self.sd[a + "attention.w_q"][h]
                k = rec @ self.sd[a + "attention.w_k"][h]
                v = x @ self.sd[a + "attention.w_v"][h]
                s = (q @ k.transpose(1, 2) / 4.0).masked_fill(~adj, -1e32)
                heads.append(torch.softmax(s, -1) @ v)
            y = self.layer_norm(x + self.lin(torch.cat(heads, -1), a + "proj"), a + "layer_norm")
            f = self.lin(torch.relu(self.lin(y, p + "pos_ffn.w_1")), p + "pos_ffn.w_2")
            x = self.layer_norm(y + f, p + "pos_ffn.layer_norm")
        return x

    def embed(self, inst, state):
        st = torch.tanh(self.lin(inst.static[state.ids], "encoder.L1"))
        dy = torch.tanh(self.lin(dynamic_features(inst, state), "encoder.L2"))
        return torch.cat([st, dy], -1)

    def greedy(self, inst):
        """Greedy decoding of every tourist: (routes, per-step log-probabilities)."""
        sd = self.sd
        s = reset(inst)
        x = self.embed(inst, s)
        enc = self.encode(x, x, lookahead(inst, s))
        lstm_in = enc[:, 0]
        s = step(inst, s, torch.zeros(inst.n_tourists, dtype=torch.long))
        h = sd["decoder.first_h_0"].expand(inst.n_tourists, -1)
        c = sd["decoder.c0"].expand(inst.n_tourists, -1)
        logps = []
        while not bool(s.done.all()):
            enc = self.encode(self.embed(inst, s), enc, lookahead(inst, s))
            h, c = torch._VF.lstm_cell(lstm_in, (h, c), sd["decoder.lstm.weight_ih"],
                                       sd["decoder.lstm.weight_hh"], sd["decoder.lstm.bias_ih"],
                                       sd["decoder.lstm.bias_hh"])
            u = torch.tanh(self.lin(enc, "decoder.W1", bias=False)
                           + self.lin(h, "decoder.W2").unsqueeze(1))
            logits = 10 * torch.tanh((u @ sd["decoder.V"]).squeeze(2))
            logp = torch.log_softmax(logits.masked_fill(~s.mask, float("-inf")), -1)
            a = logp.argmax(1)
            a = torch.where(s.done, s.current, a)
            logps.append(torch.where(s.done, 0.0, logp.gather(1, a[:, None]).squeeze(1)))
            lstm_in = enc[torch.arange(inst.n_tourists), a]
            s = step(inst, s, a)
        return s.route, torch.stack(logps, 1)


@needs_weights
def test_importer_and_compact_decoding_match_an_independent_reference(catalog):
    """The published weights, imported into our layout and decoded with active-node compaction,
    give the same greedy routes and log-probabilities as a direct full-graph implementation of
    the authors' network."""
    for path, region_id in ((PR01, "pr01"), (T101, "t101")):
        ref = Reference(_authors_sd(path))
        model = load_model(path)
        region = catalog.region(region_id)
        tourists = catalog.validation(region_id)[:4]
        inst = make_instances(region, tourists)
        with torch.inference_mode():
            ref_routes, ref_logps = ref.greedy(inst)
            out = rollout(model, inst, greedy=True)
        for k in range(len(tourists)):
            expect = [v for v in ref_routes[k].tolist() if v >= 0]
            assert out.routes[k, : len(expect)].tolist() == expect
        assert torch.allclose(out.log_prob, ref_logps.sum(1), atol=1e-4)


def test_checkpoint_roundtrip_keeps_config_weights_and_extras(tmp_path):
    """Our format stores the config and weights (and extra keys such as optimizer state) and
    load_model rebuilds an identical network."""
    cfg = ModelConfig(d_model=32, n_heads=4, d_ff=48, recursion=False, graph="complete")
    torch.manual_seed(0)
    model = PointerNet(cfg)
    path = save_model(model, tmp_path / "m.pt", epoch=7, optimizer={"lr": 1e-4})
    raw = read_checkpoint(path)
    assert raw["format"] == "optw-model" and raw["epoch"] == 7 and raw["optimizer"]["lr"] == 1e-4
    back = load_model(path)
    assert back.cfg == cfg
    for (k, v), (k2, v2) in zip(model.state_dict().items(), back.state_dict().items(),
                                strict=True):
        assert k == k2 and torch.equal(v, v2)


@needs_weights
def test_bad_checkpoints_are_rejected_clearly(tmp_path):
    """Corrupt files, other architectures, foreign dicts and non-finite weights raise
    CheckpointError naming the problem."""
    sd = _authors_sd(PR01)
    truncated = tmp_path / "cut.pt"
    truncated.write_bytes(PR01.read_bytes()[:50_000])
    with pytest.raises(CheckpointError, match="cannot read"):
        load_model(truncated)
    other = dict(sd)
    other["encoder.layers.0.pos_ffn.w_2.weight"] = torch.zeros(128, 512)
    torch.save(other, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="w_2.weight|ff2.weight"):
        load_model(tmp_path / "other.pt")
    missing = {k: v for k, v in sd.items() if k != "decoder.V"}
    torch.save(missing, tmp_path / "missing.pt")
    with pytest.raises(CheckpointError, match="decoder.V"):
        load_model(tmp_path / "missing.pt")
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="not an OPTW model checkpoint"):
        load_model(tmp_path / "foreign.pt")
    nan = dict(sd)
    nan["decoder.V"] = torch.full((128, 1), float("nan"))
    torch.save(nan, tmp_path / "nan.pt")
    with pytest.raises(CheckpointError, match="non-finite"):
        load_model(tmp_path / "nan.pt")
    with pytest.raises(CheckpointError, match="absent.pt does not exist"):
        load_model(tmp_path / "absent.pt")


def test_config_validation_and_initialisation():
    """ModelConfig rejects unknown graphs and feature counts; weights get the authors'
    Xavier-uniform bounds (per-head layout for the attention projections)."""
    with pytest.raises(ValueError, match="graph"):
        ModelConfig(graph="star")
    with pytest.raises(ValueError, match="features"):
        ModelConfig(n_static=9)
    with pytest.raises(ValueError, match="unknown model config"):
        ModelConfig.from_dict({"d_model": 128, "width": 3})
    torch.manual_seed(1)
    model = PointerNet()
    per_head = (6 / (128 * 16 + 8 * 16)) ** 0.5  # xavier on [8, 128, 16]
    assert model.layers[0].qv.weight.abs().max() <= per_head
    assert model.layers[0].qv.weight.abs().max() > 0.9 * per_head
    assert model.ptr_ref.weight.abs().max() <= (6 / 256) ** 0.5
    assert model.h0.abs().max() <= (6 / 129) ** 0.5
    assert torch.equal(model.layers[0].norm1.weight, torch.ones(128))


@pytest.mark.parametrize("act", ["none", "relu", "tanh"])
@pytest.mark.parametrize("with_add", [False, True])
def test_fast_linear_matches_torch(act, with_add):
    """The oneDNN linear (and its hand-written backward) equals F.linear + activation, for
    inputs above and below the size where it is used."""
    torch.manual_seed(0)
    for rows in (5, 200):
        x = torch.randn(rows, 24, requires_grad=True)
        w = torch.randn(16, 24, requires_grad=True)
        b = torch.randn(16, requires_grad=True)
        add = torch.randn(rows, 16, requires_grad=True) if with_add else None
        y = linear(x, w, b, act=act, add=add)
        ref = F.linear(x, w, b) + (add if with_add else 0)
        ref = {"none": ref, "relu": torch.relu(ref), "tanh": torch.tanh(ref)}[act]
        assert torch.allclose(y, ref, atol=1e-5)
        g = torch.randn_like(y)
        leaves = [x, w, b] + ([add] if with_add else [])
        got = torch.autograd.grad(y, leaves, g)
        want = torch.autograd.grad(ref, leaves, g)
        for a, e in zip(got, want, strict=True):
            assert torch.allclose(a, e, atol=1e-4)


def test_memory_lean_blocks_match_the_plain_composition():
    """The training blocks that keep fewer tensors (layer norm from its output, feed-forward
    and pointer with recomputation, embedding) give the plain composition's values and
    gradients."""
    torch.manual_seed(0)
    n, d = 150, 32

    def check(fast, plain, inputs):
        leaves = [t.detach().clone().requires_grad_(t.dtype.is_floating_point and t.requires_grad)
                  for t in inputs]
        twins = [t.detach().clone().requires_grad_(t.requires_grad) for t in leaves]
        y, ref = fast(*leaves), plain(*twins)
        assert torch.allclose(y, ref, atol=1e-5)
        g = torch.randn_like(y)
        got = torch.autograd.grad(y, [t for t in leaves if t.requires_grad], g)
        want = torch.autograd.grad(ref, [t for t in twins if t.requires_grad], g)
        for a, e in zip(got, want, strict=True):
            assert torch.allclose(a, e, atol=1e-4, rtol=1e-4)

    def req(*shape):
        return torch.randn(*shape).requires_grad_()

    check(lambda x, w, b: layer_norm(x, w, b),
          lambda x, w, b: F.layer_norm(x, (d,), w, b), [req(n, d), req(d) + 2, req(d)])
    check(feed_forward,
          lambda y, w1, b1, w2, b2: y + F.linear(torch.relu(F.linear(y, w1, b1)), w2, b2),
          [req(n, d), req(48, d), req(48), req(d, 48), req(d)])
    route = torch.arange(n) % 7
    check(lambda e, w, q, v: pointer_logits(e, w, q, route, v, 10.0),
          lambda e, w, q, v: 10 * torch.tanh(torch.tanh(F.linear(e, w) + q[route]) @ v),
          [req(n, d), req(d, d), req(7, d), req(d)])
    dyn = torch.randn(n, 8)
    check(lambda s, w, b: embed(s, dyn, w, b),
          lambda s, w, b: torch.cat([s, torch.tanh(F.linear(dyn, w, b))], 1),
          [req(n, 16), req(16, 8), req(16)])


def test_deferred_grads_equal_autograds_own(catalog):
    """Inside ``deferred_grads`` a training rollout's backward gives every parameter the
    gradient autograd gives it alone (within float rounding), weights used at many steps and
    in passes below the fast path's size alike; and a backward after the block takes the usual
    path."""
    from optw.decode.reinforce import reinforce_loss

    region = catalog.region("pr01")
    inst = make_instances(region, catalog.validation("pr01")[:4])
    ids = torch.arange(4).repeat_interleave(16)
    torch.manual_seed(0)
    model = PointerNet().train()

    def grads(defer: bool) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        out = rollout(model, inst, ids, generator=torch.Generator().manual_seed(1))
        loss = reinforce_loss(out.reward, out.log_prob, out.entropy, 16, 0.01).loss
        if defer:
            with deferred_grads() as sums:
                loss.backward()
                assert len(sums) == 10  # per layer qv, out, ff1, ff2; pointer; embedding
        else:
            loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    plain, deferred = grads(False), grads(True)
    assert plain.keys() == deferred.keys()
    for name, g in plain.items():
        assert torch.allclose(deferred[name], g, rtol=1e-4, atol=1e-6 * float(g.abs().max())), name

    w = torch.randn(16, 24, requires_grad=True)
    with deferred_grads():  # only the forward inside: the backward outside is autograd's
        y = linear(torch.randn(100, 24), w)
    y.sum().backward()
    assert w.grad is not None


def test_variants_decode_valid_routes(catalog):
    """The no-recursion and complete-graph variants decode (greedy and sampled) into routes
    that pass the validator."""
    from optw.env import check_route

    region = catalog.region("pr01")
    tourists = catalog.validation("pr01")[:3]
    inst = make_instances(region, tourists)
    for cfg in (ModelConfig(recursion=False), ModelConfig(graph="complete")):
        torch.manual_seed(0)
        model = PointerNet(cfg)
        for greedy in (True, False):
            gen = torch.Generator().manual_seed(0)
            with torch.inference_mode():
                out = rollout(model, inst, greedy=greedy, generator=gen)
            for k in range(len(tourists)):
                route = [v for v in out.routes[k].tolist() if v >= 0]
                assert check_route(region, route, tourists, k).ok
