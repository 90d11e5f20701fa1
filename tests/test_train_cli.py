"""`optw train` as a user runs it: model settings checked like training settings, errors that
name the option or the file's key, nothing left in --out by a refused or failed run, honest
resume messages; and the default torch thread count (optw.threads)."""

from __future__ import annotations

import math
import os

import pytest

from optw.cli import main
from optw.errors import ConfigError
from optw.model import ModelConfig
from optw.train.config import TrainConfig


def _train(tiny_catalog, out, *extra: str) -> list[str]:
    return ["train", "--region", "r199", "--batch-size", "4", "--catalog",
            str(tiny_catalog.path), "--out", str(out), *extra]


def _one_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("optw train: error: "), err
    assert "Traceback" not in err and out == "", (out, err)
    return lines[0]


BAD_MODELS = [  # (table text, key the error names)
    ("d_model = 0", "d_model"), ("n_heads = 0", "n_heads"), ("d_ff = 0", "d_ff"),
    ("n_layers = 0", "n_layers"), ("d_model = -8", "d_model"), ("d_model = 12", "d_model"),
    ("d_model = 9000000", "d_model"), ("n_layers = 1000", "n_layers"), ("clip = 0", "clip"),
    ("clip = inf", "clip"), ("clip = nan", "clip"), ("d_model = 1.5", "d_model"),
    ("recursion = 'yes'", "recursion"), ("graph = 'star'", "graph"),
]


@pytest.mark.parametrize("table", ["model", "train.model"])
def test_bad_model_settings_name_the_file_and_key_and_write_nothing(tiny_catalog, tmp_path,
                                                                     capsys, table):
    """`[model] d_model = 0` (a ZeroDivisionError traceback before, with config.json left in
    --out) and every other bad model setting, top level or in [train.model]: exit 2, one line
    naming the file and model.<key>, --out not created."""
    out = tmp_path / "out"
    for text, key in BAD_MODELS:
        cfg = tmp_path / "cfg.toml"
        head = "[train]\nregions = ['r199']\n" if table == "train.model" else ""
        cfg.write_text(f"{head}[{table}]\n{text}\n")
        assert main(_train(tiny_catalog, out, "--config", str(cfg))) == 2, text
        line = _one_line(capsys)
        assert str(cfg) in line and f"model.{key} = " in line, (text, line)
        assert not out.exists(), text


def test_model_config_errors_name_their_key():
    """ModelConfig checks sizes before ratios (n_heads = 0 is named, not divided by) and its
    ConfigError carries the key; TrainConfig prefixes it with model."""
    for kwargs, key in (({"n_heads": 0}, "n_heads"), ({"d_model": 0}, "d_model"),
                        ({"clip": math.inf}, "clip"), ({"d_model": 100, "n_heads": 8},
                                                       "d_model")):
        with pytest.raises(ConfigError) as err:
            ModelConfig(**kwargs)
        assert err.value.key == key and str(err.value).startswith(f"{key} = ")
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_dict({"regions": ["r199"], "model": {"d_model": 0}}, source="x.toml")
    assert err.value.key == "model.d_model"
    assert str(err.value).startswith("x.toml: model.d_model = 0: ")


def test_bad_options_name_the_option_and_write_nothing(tiny_catalog, tmp_path, capsys):
    """--seed -5 (numpy refused it deep in training), --seed 2**40, --threads 1000 and
    --device cuda on a machine without CUDA: one line naming the option; --out not created."""
    import torch

    out = tmp_path / "out"
    cases = [("--seed", "-5"), ("--seed", str(2**40)), ("--threads", "1000"),
             ("--epochs", "0")]
    if not torch.cuda.is_available():
        cases += [("--device", "cuda"), ("--device", "cuda:3")]
    for option, value in cases:
        assert main(_train(tiny_catalog, out, "--epochs", "2", option, value)) == 2
        line = _one_line(capsys)
        assert f"error: {option}" in line and value.split(":")[0] in line, line
        assert not out.exists(), (option, value)


def test_a_run_that_fails_before_its_first_checkpoint_leaves_nothing(tiny_catalog, tmp_path,
                                                                    capsys):
    """A failure inside training (an --init file that is not a model) removes the config.json
    this run wrote and the folder it created."""
    out = tmp_path / "out"
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a model")
    assert main(_train(tiny_catalog, out, "--epochs", "2", "--init", str(bad))) == 2
    assert "bad.pt" in _one_line(capsys)
    assert not out.exists()


def test_resume_says_how_many_epochs_it_trained(tiny_catalog, tmp_path, capsys):
    """`--resume --epochs 3` after 2 says "trained 1 more epochs (3 in all)" (it said "trained
    3 epochs"); with nothing left it says so and trains nothing."""
    out = tmp_path / "out"
    args = _train(tiny_catalog, out, "--threads", "1", "--val-every", "0")
    assert main([*args, "--epochs", "2"]) == 0
    assert "trained 2 epochs in " in capsys.readouterr().out
    assert main([*args, "--epochs", "3", "--resume"]) == 0
    assert "trained 1 more epochs (3 in all) in " in capsys.readouterr().out
    before = (out / "last.pt").read_bytes()
    assert main([*args, "--epochs", "3", "--resume"]) == 0
    said = capsys.readouterr().out
    assert "nothing to train" in said and "3 epochs" in said and "trained" not in said
    assert (out / "last.pt").read_bytes() == before


def test_default_threads_follow_the_free_cores(monkeypatch):
    """optw.threads: the cores granted (affinity, $OMP_NUM_THREADS) less the busy ones (the
    load average less this process's share), at least 1; explicit counts are bounded."""
    from optw import threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    granted = threads.granted_cpus()
    assert 1 <= granted <= (os.cpu_count() or 1)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert threads.default_threads() == granted  # a quiet machine: every granted core
    monkeypatch.setattr(os, "getloadavg", lambda: (float(os.cpu_count() or 1) + 2, 0.0, 0.0))
    assert threads.default_threads() == 1  # every core busy with other work: one thread
    # a long-lived process (a test session, a server) that used much CPU in its life is not
    # taken for the load now
    monkeypatch.setattr(threads, "_age_s", lambda: 3600.0)
    monkeypatch.setattr(threads.time, "process_time", lambda: 600.0)
    assert threads.default_threads() == 1
    monkeypatch.undo()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert threads.granted_cpus() == 1 and threads.default_threads() == 1
    if hasattr(os, "sched_setaffinity") and granted > 1:
        monkeypatch.delenv("OMP_NUM_THREADS")
        mask = os.sched_getaffinity(0)
        try:
            os.sched_setaffinity(0, {min(mask)})
            assert threads.granted_cpus() == 1
        finally:
            os.sched_setaffinity(0, mask)
    for bad in (0, -1, threads.MAX_THREADS + 1, True, 2.0):
        with pytest.raises(ValueError, match="^--threads: "):
            threads.check_threads(bad, "--threads")


def test_job_profile_model_settings_are_checked_when_the_profile_loads(tmp_path):
    """A job profile's `[train.model] d_model = 0` passed the profile checks and failed in the
    Ray Train worker (retried, rc 2); now loading the profile refuses it naming the file,
    the table and model.d_model."""
    from optw.distributed.profile import load_profile

    path = tmp_path / "bad.toml"
    path.write_text("[job]\nname = 'bad'\n[train]\nepochs = 2\n[train.model]\nd_model = 0\n")
    with pytest.raises(ConfigError) as err:
        load_profile(path)
    message = str(err.value)
    assert str(path) in message and "[train]" in message and "model.d_model = 0" in message


def test_rollout_option_is_logged_and_graph_needs_cuda(tiny_catalog, tmp_path, capsys):
    """`--rollout` sets the run's training rollout, written to config.json with the other
    settings; `graph` (CUDA graphs) on a machine or device without CUDA, from the option or
    from the --config file, is one line naming where it was asked, and nothing is written."""
    import json

    import torch

    out = tmp_path / "run"
    assert main(_train(tiny_catalog, out, "--epochs", "2", "--threads", "1",
                       "--rollout", "static")) == 0
    assert json.loads((out / "config.json").read_text())["rollout"] == "static"
    capsys.readouterr()
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: graph would run")
    refused = tmp_path / "refused"
    assert main(_train(tiny_catalog, refused, "--rollout", "graph")) == 2
    assert "--rollout graph replays CUDA graphs" in _one_line(capsys)
    cfg = tmp_path / "cfg.toml"
    cfg.write_text("[train]\nrollout = 'graph'\n")
    assert main(_train(tiny_catalog, refused, "--config", str(cfg))) == 2
    assert f"rollout = 'graph' in {cfg}" in _one_line(capsys)
    assert main(_train(tiny_catalog, refused, "--rollout", "graph-compiled")) == 2
    assert "--rollout graph-compiled replays CUDA graphs" in _one_line(capsys)
    assert not refused.exists()
