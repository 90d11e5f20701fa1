"""REINFORCE training: learning, exact resume, configs, schedule, CLI errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from optw.checks import load_mapping
from optw.errors import ConfigError
from optw.train import Checkpointer, MetricsHistory, TrainConfig, train


def _config(**kw) -> TrainConfig:
    base = dict(regions=["r199"], epochs=20, batch_size=8, val_every=0, val_tourists=16,
                checkpoint_every=0, seed=5, threads=1, device="cpu")
    return TrainConfig(**{**base, **kw})


def test_training_improves_greedy_validation(tiny_catalog):
    """150 epochs from scratch on a tiny region raise the mean greedy validation score
    clearly above the untrained model's (measured: 115.3 against 10.7; 117.2 after 300)."""
    history = MetricsHistory()
    cfg = _config(regions=["pr99"], epochs=150, batch_size=32, val_every=150, lr=1e-3)
    before = train(cfg.replace(epochs=1, lr=1e-12), tiny_catalog).last_validation["val_score"]
    after = train(cfg, tiny_catalog, [history]).last_validation["val_score"]
    assert after > before * 1.1, (before, after)
    first = sum(m["mean_reward"] for m in history.epochs[:30]) / 30
    last = sum(m["mean_reward"] for m in history.epochs[-30:]) / 30
    assert last > first


def test_resume_reproduces_uninterrupted_run(tiny_catalog, tmp_path):
    """Stopping at epoch 6 and resuming from last.pt gives exactly the uninterrupted run's
    next epochs (rewards, losses) and final weights."""
    cfg = _config(epochs=12)
    full = MetricsHistory()
    straight = train(cfg, tiny_catalog, [full])

    part = Checkpointer(tmp_path)
    train(cfg.replace(epochs=6), tiny_catalog, [part])
    ckpt = torch.load(part.last, weights_only=True)
    assert ckpt["train"]["epoch"] == 6
    rest = MetricsHistory()
    resumed = train(cfg, tiny_catalog, [rest], resume=part.last)
    assert [m["epoch"] for m in rest.epochs] == list(range(7, 13))
    for a, b in zip(full.epochs[6:], rest.epochs, strict=True):
        assert a["mean_reward"] == b["mean_reward"] and a["loss"] == pytest.approx(b["loss"])
    for (k, v), w in zip(straight.model.state_dict().items(),
                         resumed.model.state_dict().values(), strict=True):
        assert torch.allclose(v, w, atol=1e-6), k


def test_a_checkpoint_of_another_device_resumes_with_a_fresh_stream(tiny_catalog, tmp_path):
    """A checkpoint whose torch RNG state is another kind of device's (a CUDA generator's
    16 bytes, here on the CPU) resumes: weights, optimiser and epoch go on, and the sampling
    stream is seeded from the seed and epoch, the same on every such resume."""
    cfg = _config(epochs=6)
    part = Checkpointer(tmp_path / "a")
    train(cfg.replace(epochs=3), tiny_catalog, [part])
    ckpt = torch.load(part.last, weights_only=True)
    ckpt["train"]["rng"]["torch"] = torch.zeros(16, dtype=torch.uint8)  # as CUDA writes it
    runs = []
    for _ in range(2):
        history = MetricsHistory()
        train(cfg, tiny_catalog, [history], resume=ckpt)
        runs.append(history.epochs)
    assert [m["epoch"] for m in runs[0]] == [4, 5, 6]
    assert [m["mean_reward"] for m in runs[0]] == [m["mean_reward"] for m in runs[1]]


def test_static_rollout_trains_the_same_model(tiny_catalog):
    """Training with the static-shape rollout (CUDA's default, asked for here on the CPU with
    ``rollout``) samples the same routes every epoch as with the compacted one, and ends
    with weights equal within rounding: which rollout ran does not change a run. The CUDA
    graph rollout is refused on the CPU, naming the setting."""
    cfg = _config(epochs=4, tourists_per_epoch=2, batch_size=4, val_tourists=2)
    runs = {}
    for mode in ("compact", "static"):
        hist = MetricsHistory()
        runs[mode] = (train(cfg.replace(rollout=mode), tiny_catalog, [hist]), hist)
    with pytest.raises(ValueError, match="rollout = graph .* needs a CUDA device"):
        train(cfg.replace(rollout="graph", device="cpu"), tiny_catalog)
    (a, ha), (b, hb) = runs["compact"], runs["static"]
    assert [m["mean_reward"] for m in ha.epochs] == [m["mean_reward"] for m in hb.epochs]
    for (k, v), w in zip(a.model.state_dict().items(), b.model.state_dict().values(),
                         strict=True):  # Adam's steps are ~lr where a gradient is ~0
        assert torch.allclose(v, w, atol=2 * cfg.lr), k


def test_global_training_draws_several_regions(tiny_catalog):
    """A global model trains on a list of regions and validates on each of them."""
    res = train(_config(regions=["r199", "pr99", "t199"], epochs=6, val_every=6),
                tiny_catalog)
    assert {"val_score/r199", "val_score/pr99", "val_score/t199"} <= set(res.last_validation)


def test_k_tourists_per_epoch(tiny_catalog):
    """K tourists × B routes per step (per-tourist baselines) trains too."""
    res = train(_config(epochs=3, tourists_per_epoch=4, batch_size=4), tiny_catalog)
    assert res.epochs == 3


def test_learning_rate_schedule():
    """From scratch: lr·0.96^(epoch // 5000) floored at 1e-5; fine-tuning: fixed 1e-5."""
    cfg = TrainConfig()
    assert cfg.learning_rate(0) == 1e-4
    assert cfg.learning_rate(4_999) == 1e-4
    assert cfg.learning_rate(5_000) == pytest.approx(0.96e-4)
    assert cfg.learning_rate(10**7) == 1e-5
    assert cfg.replace(finetune=True).learning_rate(123) == 1e-5


def test_config_files_and_errors(tmp_path):
    """Configs build from TOML and YAML tables; unknown keys and bad values are named."""
    (tmp_path / "a.toml").write_text('[train]\nregions = ["c101"]\nepochs = 7\nbeta = 0.02\n')
    assert TrainConfig.from_dict(load_mapping(tmp_path / "a.toml")["train"]).epochs == 7
    (tmp_path / "b.yaml").write_text("regions: [c101]\nbatch_size: 16\n")
    assert TrainConfig.from_dict(load_mapping(tmp_path / "b.yaml")).batch_size == 16
    (tmp_path / "c.toml").write_text("epochz = 3\n")
    with pytest.raises(ConfigError, match="epochz"):
        TrainConfig.from_dict(load_mapping(tmp_path / "c.toml"), "c.toml")
    with pytest.raises(ConfigError, match="batch_size"):
        TrainConfig(batch_size=0)
    with pytest.raises(ConfigError, match="lr_decay"):
        TrainConfig(lr_decay=1.5)
    with pytest.raises(ConfigError, match="not found"):
        load_mapping(tmp_path / "missing.toml")
    assert TrainConfig().config_hash() == TrainConfig(threads=2).config_hash()
    assert TrainConfig().config_hash() != TrainConfig(beta=0.1).config_hash()
    with pytest.raises(ConfigError, match="rollout = 'graphs': must be one of"):
        TrainConfig(rollout="graphs")
    assert "rollout" not in TrainConfig().hash_dict()  # earlier configs keep their hashes
    assert TrainConfig().config_hash() != TrainConfig(rollout="graph").config_hash()


def test_unknown_region_and_resume_of_model_file(tiny_catalog, tmp_path):
    """Unknown regions and a model file given as a training checkpoint fail clearly."""
    with pytest.raises(KeyError, match="zz1"):
        train(_config(regions=["zz1"]), tiny_catalog)
    from optw.model import PointerNet, save_model

    path = save_model(PointerNet(), tmp_path / "m.pt")
    with pytest.raises(ValueError, match="not a training checkpoint"):
        train(_config(), tiny_catalog, resume=path)


def test_cli_train_and_resume(tiny_catalog, tmp_path, capsys):
    """`optw train` writes last.pt/config.json, resumes with --resume, rejects bad regions."""
    from optw.cli import main

    out = tmp_path / "run"
    args = ["train", "--region", "r199", "--epochs", "4", "--batch-size", "4",
            "--catalog", str(tiny_catalog.path), "--out", str(out), "--threads", "1"]
    assert main(args) == 0
    assert (out / "last.pt").exists() and (out / "config.json").exists()
    assert main([*args[:4], "6", *args[5:], "--resume"]) == 0
    assert torch.load(out / "last.pt", weights_only=True)["train"]["epoch"] == 6
    assert main(["train", "--region", "nope", "--catalog", str(tiny_catalog.path)]) == 2
    assert "unknown region" in capsys.readouterr().err


def test_cli_resume_refuses_what_does_not_match(tiny_catalog, tmp_path, capsys):
    """`optw train --resume` refuses a checkpoint of other regions or another model, names a
    changed epoch budget, and a new run never overwrites an earlier one's files."""
    from optw.cli import main

    out = tmp_path / "run"
    args = ["train", "--region", "r199", "--epochs", "2", "--batch-size", "4",
            "--catalog", str(tiny_catalog.path), "--out", str(out), "--threads", "1"]
    assert main(args) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    for extra, word in ((["--resume", "--region", "pr99"], "regions"),
                        (["--resume", "--batch-size", "8"], "batch_size"),
                        ([], "--resume")):
        argv = [*args, *extra]
        if "--region" in extra:
            argv = ["train", "--region", "pr99", *args[3:], "--resume"]
        if "--batch-size" in extra:
            argv = [*args[:5], "--batch-size", "8", *args[7:], "--resume"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and word in err, err
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    config = tmp_path / "model.toml"
    config.write_text("[train]\nregions = ['r199']\n[train.model]\nn_layers = 1\n")
    assert main([*args, "--config", str(config), "--resume"]) == 2
    assert "n_layers" in capsys.readouterr().err
    assert main([*args[:4], "3", *args[5:], "--resume"]) == 0
    assert "epochs = 3 (it was trained with 2)" in capsys.readouterr().out


def test_global_model_file_loads_and_solves(tiny_catalog, tmp_path):
    """A model trained on several regions (per-region validation metrics in its file) loads
    with ``weights_only=True``, resumes, and solves through ``optw solve``."""
    from optw.cli import main
    from optw.model import load_model, read_checkpoint

    ckpt = Checkpointer(tmp_path)
    res = train(_config(regions=["r199", "pr99"], epochs=4, val_every=2), tiny_catalog, [ckpt])
    assert all(type(v) is float for v in res.last_validation.values()), res.last_validation
    state = read_checkpoint(ckpt.last)
    assert {"val_score/r199", "val_score/pr99"} <= set(state["train"]["last_validation"])
    load_model(ckpt.last)
    train(_config(regions=["r199", "pr99"], epochs=6), tiny_catalog, resume=ckpt.last)
    rc = main(["solve", "--catalog", str(tiny_catalog.path), "--region", "pr99",
               "--checkpoint", str(ckpt.last), "--beams", "2", "--json"])
    assert rc == 0


def test_every_checkpoint_writer_guards_plain_values(tmp_path):
    """Model files, training snapshots and Ray Train checkpoints all go through one writer
    that refuses values ``torch.load(weights_only=True)`` would reject, naming the field."""

    from optw.model import ModelConfig, PointerNet, save_model, write_checkpoint

    with pytest.raises(TypeError, match=r"train\.last_validation\.val_score.*numpy"):
        write_checkpoint({"train": {"last_validation": {"val_score": np.float64(1.0)}}},
                         tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()
    model = PointerNet(ModelConfig())
    with pytest.raises(TypeError, match="epoch"):
        save_model(model, tmp_path / "m.pt", epoch=np.int64(3))
    assert list(tmp_path.iterdir()) == []
    save_model(model, tmp_path / "m.pt", epoch=3, metrics={"a": 1.5, "b": [1, (2, None)]})


def test_model_files_written_before_the_fix_still_load(tmp_path):
    """Files whose metrics hold numpy scalars (as earlier versions wrote them) load: numpy
    scalars are rebuilt from an allow-list and returned as Python numbers; other globals are
    still refused."""
    import io

    from optw.model import (
        CheckpointError,
        ModelConfig,
        PointerNet,
        checkpoint_dict,
        load_model,
        read_checkpoint,
    )

    model = PointerNet(ModelConfig())
    old = checkpoint_dict(model, train={"last_validation": {"val_score/pr01": np.float64(2.5),
                                                            "n": np.int64(4)}})
    path = tmp_path / "old.pt"
    torch.save(old, path)  # what the code before the fix wrote
    state = read_checkpoint(path)
    val = state["train"]["last_validation"]
    assert val == {"val_score/pr01": 2.5, "n": 4}
    assert type(val["val_score/pr01"]) is float and type(val["n"]) is int
    load_model(path)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    buf = io.BytesIO()
    torch.save({"x": Evil()}, buf)
    (tmp_path / "evil.pt").write_bytes(buf.getvalue())
    with pytest.raises(CheckpointError):
        read_checkpoint(tmp_path / "evil.pt")


def test_foreach_optimiser_steps_equal_the_per_parameter_loop():
    """make_optimizer's Adam (foreach) and foreach clipping step a network to the same weights
    as the per-parameter loop of earlier runs, bit for bit on the CPU: a checkpoint written
    before resumes exactly, and active search's results do not change."""
    from optw.model import PointerNet
    from optw.train.step import clip_gradients, make_optimizer

    torch.manual_seed(0)
    nets = [PointerNet(), PointerNet()]
    nets[1].load_state_dict(nets[0].state_dict())
    opts = [torch.optim.Adam(nets[0].parameters(), lr=1e-3), make_optimizer(nets[1], 1e-3)]
    for step in range(4):
        norms = []
        for i, (net, opt) in enumerate(zip(nets, opts, strict=True)):
            gen = torch.Generator().manual_seed(step)
            for p in net.parameters():
                p.grad = torch.randn(p.shape, generator=gen)
            params = net.parameters()
            norms.append(clip_gradients(params, 1.0) if i == 1
                         else torch.nn.utils.clip_grad_norm_(params, 1.0))
            opt.step()
        assert torch.equal(norms[0], norms[1])
    for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        assert torch.equal(a, b)


def test_imitation_then_reinforce_learns_and_resumes_exactly(tiny_catalog, tmp_path):
    """A run with demonstrations first lowers their negative log-likelihood over its
    imitation epochs (reported as ``imitation_loss``), then trains with REINFORCE (reported as
    ``mean_reward``) for its ``epochs``; a run stopped inside the imitation phase and resumed
    from last.pt ends with exactly the uninterrupted run's weights."""
    cfg = _config(regions=["pr99"], epochs=4, demos=16, imitation_epochs=30,
                  imitation_batch=8, imitation_lr=3e-3)
    hist = MetricsHistory()
    straight = train(cfg, tiny_catalog, [hist])
    assert straight.epochs == 34
    losses = [m["imitation_loss"] for m in hist.epochs[:30]]
    assert "mean_reward" in hist.epochs[30] and "imitation_loss" not in hist.epochs[30]
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
    part = Checkpointer(tmp_path)
    train(cfg.replace(epochs=4, imitation_epochs=30), tiny_catalog,
          [part, _StopAt(12)])
    resumed = train(cfg, tiny_catalog, resume=part.last)
    for (k, v), w in zip(straight.model.state_dict().items(),
                         resumed.model.state_dict().values(), strict=True):
        assert torch.equal(v, w), k


class _StopAt(MetricsHistory):
    """Stops a run after ``epoch`` epochs (as an interruption would, after a checkpoint)."""

    def __init__(self, epoch: int):
        super().__init__()
        self.at = epoch

    def on_epoch_end(self, ctx, metrics):
        ctx.stop = ctx.epoch >= self.at


def test_diverged_run_names_lr_and_epoch(tiny_catalog, tmp_path):
    """A run whose weights are no longer finite stops with one TrainingDiverged (a user
    error) naming the epoch and the lr, not a sampling error from deep inside torch: a
    checkpoint whose pointer weights became NaN, resumed."""
    from optw.model import read_checkpoint
    from optw.train.step import TrainingDiverged

    cfg = _config(regions=["pr99"], epochs=3, lr=0.5, tourists_per_epoch=4)
    part = Checkpointer(tmp_path)
    train(cfg.replace(epochs=1), tiny_catalog, [part])
    state = read_checkpoint(part.last)
    state["state_dict"]["ptr_v"].fill_(float("nan"))
    with pytest.raises(TrainingDiverged, match=r"at epoch 2 with lr = 0\.5"):
        train(cfg, tiny_catalog, resume=state)


def test_finetuning_validates_its_starting_model(tiny_catalog, tmp_path):
    """A run started from another model validates once before its first epoch (step 0: the
    starting model on this region) and again at its end; the first validation does not count
    as its best."""
    from optw.model import PointerNet, save_model

    torch.manual_seed(3)
    init = save_model(PointerNet(), tmp_path / "init.pt")
    hist = MetricsHistory()
    cfg = _config(epochs=2, finetune=True, val_every=0)
    train(cfg, tiny_catalog, [hist], init=init)
    assert [v["epoch"] for v in hist.validations] == [0, 2]


def test_each_step_kind_must_fit_and_each_bound_is_stated_once():
    """``check_fits`` refuses an imitation step too large for memory, naming imitation_batch
    (not only REINFORCE epochs); imitation_batch has one bound, stated the same way for a
    value too small and one too large."""
    from optw.errors import ConfigError
    from optw.train.config import MAX_ROUTES, check_fits

    big = TrainConfig(regions=["t101"], demos=1, imitation_epochs=1, imitation_batch=MAX_ROUTES)
    with pytest.raises(ConfigError, match="imitation_batch = 1048576 routes of 10000 nodes") as e:
        check_fits(big, 10_000, "p.toml [finetune]")
    assert e.value.key == "imitation_batch" and str(e.value).startswith("p.toml [finetune]")
    check_fits(big.replace(imitation_epochs=0, demo_tourists=True), 10_000)  # never imitates
    bound = f"must be an integer in 1..{MAX_ROUTES:,}"
    for bad in (0, 10**8):
        with pytest.raises(ConfigError, match=bound):
            TrainConfig(imitation_batch=bad)


def test_devices_are_checked_against_where_a_run_trains():
    """``check_devices``: a CUDA device or the graph rollout on workers without CUDA is a
    ConfigError naming the setting; the same settings pass where CUDA is."""
    from optw.errors import ConfigError
    from optw.train.config import check_devices

    for config, key in ((TrainConfig(device="cuda"), "device"),
                        (TrainConfig(rollout="graph"), "rollout"),
                        (TrainConfig(rollout="graph", device="cpu"), "rollout")):
        with pytest.raises(ConfigError, match=f"p.toml \\[train\\]: {key} = ") as e:
            check_devices(config, 0, where="p.toml [train]")
        assert e.value.key == key
    check_devices(TrainConfig(rollout="graph", device="cuda"), 1)
    with pytest.raises(ConfigError, match="rollout"):
        check_devices(TrainConfig(rollout="graph", device="cpu"), 1)
    with pytest.raises(ConfigError, match="device = 'cuda:2'.*2 CUDA device"):
        check_devices(TrainConfig(device="cuda:2"), 2)
