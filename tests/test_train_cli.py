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
    """--seed -5 (numpy refused it deep in training), --seed 2**40, --threads 1000, epochs
    and routes per epoch out of bounds (--batch-size 100000000 once asked for 82 GB and crashed,
    --tourists-per-epoch 100000 was killed for memory) and --device cuda on a machine without
    CUDA: one line naming the option; --out not created."""
    import torch

    out = tmp_path / "out"
    cases = [("--seed", "-5"), ("--seed", str(2**40)), ("--threads", "1000"),
             ("--epochs", "0"), ("--epochs", str(10**10)), ("--batch-size", "100000000"),
             ("--tourists-per-epoch", "100000"), ("--val-every", "-1")]
    if not torch.cuda.is_available():
        cases += [("--device", "cuda"), ("--device", "cuda:3")]
    for option, value in cases:
        assert main(_train(tiny_catalog, out, "--epochs", "2", option, value)) == 2
        line = _one_line(capsys)
        key = option.strip("-").replace("-", "_")  # or named as the setting, with memory
        assert (f"error: {option}" in line or f"{key} = " in line) and (
            value.split(":")[0] in line), line
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
    assert "--rollout graph: rollout = 'graph' replays CUDA graphs" in _one_line(capsys)
    cfg = tmp_path / "cfg.toml"
    cfg.write_text("[train]\nrollout = 'graph'\n")
    assert main(_train(tiny_catalog, refused, "--config", str(cfg))) == 2
    assert f"{cfg}: rollout = 'graph' replays CUDA graphs" in _one_line(capsys)
    assert not refused.exists()


def test_an_epoch_too_large_for_memory_names_both_settings(tiny_catalog, tmp_path, capsys):
    """Routes per epoch within the absolute bound but beyond this machine's memory for the
    region's size are refused before anything starts, naming batch_size and
    tourists_per_epoch; an lr beyond 1 (once a NaN sampling error deep in training) is
    refused naming lr."""
    out = tmp_path / "out"
    assert main(_train(tiny_catalog, out, "--batch-size", "1024", "--tourists-per-epoch",
                       "1024")) == 2
    line = _one_line(capsys)
    assert "batch_size = 1024 × tourists_per_epoch = 1024" in line and "GiB" in line, line
    cfg = tmp_path / "cfg.toml"
    cfg.write_text("[train]\nlr = 1e308\n")
    assert main(_train(tiny_catalog, out, "--config", str(cfg))) == 2
    assert "lr = 1e+308" in _one_line(capsys)
    assert not out.exists()


def test_resume_keeps_the_runs_own_settings(tiny_catalog, tmp_path, capsys):
    """`--resume` without repeating the run's options continues with its own settings (seed,
    batch size, ...) instead of the defaults, and says nothing about changed settings; an
    option given now still overrides where a resume allows it (the epoch budget)."""
    out = tmp_path / "out"
    base = ["train", "--region", "r199", "--catalog", str(tiny_catalog.path), "--out",
            str(out), "--threads", "1", "--val-every", "0"]
    assert main([*base, "--epochs", "2", "--seed", "1", "--batch-size", "4"]) == 0
    capsys.readouterr()
    assert main([*base, "--epochs", "3", "--resume"]) == 0
    said = capsys.readouterr().out
    assert "it was trained with" in said and "epochs = 3" in said and "seed" not in said
    assert "trained 1 more epochs (3 in all)" in said


def test_out_folder_of_other_files_is_refused(tiny_catalog, tmp_path, capsys):
    """`--out` naming a folder that holds other files (not an optw train run) is refused in
    one line and nothing in it changes; a run's own folder (marked) resumes."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert main(_train(tiny_catalog, mine, "--epochs", "1")) == 2
    assert "holds other files (notes.txt)" in _one_line(capsys)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    run = tmp_path / "run"
    assert main(_train(tiny_catalog, run, "--epochs", "1", "--threads", "1")) == 0
    assert (run / ".optw-train").is_file()
    assert main(_train(tiny_catalog, run, "--epochs", "2", "--threads", "1", "--resume")) == 0


def test_patience_stops_a_run_without_better_validations(tiny_catalog, tmp_path, capsys):
    """`--patience 1` ends a run after a validation that is not better than the best so far
    (an untrainable lr keeps the score flat) and says where it stopped."""
    out = tmp_path / "out"
    assert main(_train(tiny_catalog, out, "--epochs", "40", "--val-every", "2", "--threads",
                       "1", "--patience", "1", "--config", str(_tiny_lr(tmp_path)))) == 0
    said = capsys.readouterr().out
    assert "stopped at 4 of 40" in said, said


def _tiny_lr(tmp_path):
    cfg = tmp_path / "lr.toml"
    cfg.write_text("[train]\nlr = 1e-12\nlr_min = 1e-12\n")
    return cfg


def test_demonstrations_are_announced_and_the_bar_ends_on_the_last_validation(
        tiny_catalog, tmp_path, capsys):
    """A run that imitates ILS first says it computes the demonstrations (a line, then a
    progress bar), and its progress bar ends on the validation score that the last line gives
    (it showed none, or an older one, when the last epoch's validation came after the bar's
    update)."""
    import re

    from conftest import copy_catalog

    cat = copy_catalog(tiny_catalog, tmp_path / "catalog")  # the demonstrations go there
    cfg = tmp_path / "demos.toml"
    cfg.write_text("[train]\ndemos = 8\nimitation_epochs = 2\nimitation_batch = 4\n"
                   "val_every = 0\nval_tourists = 4\n")
    argv = ["train", "--region", "r199", "--epochs", "1", "--batch-size", "4", "--threads",
            "1", "--catalog", str(cat), "--config", str(cfg), "--out", str(tmp_path / "run")]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.startswith("demonstrations: 8 ILS routes per region (1 region(s)); those the "
                          "catalog does not store yet are computed now\n"), out
    assert re.search(r"demonstrations: 100%.* 8/8", err), err
    final = re.search(r"greedy validation score (-?[\d.]+)", out).group(1)
    shown = re.findall(r"val=(-?[\d.]+)", err)
    assert shown and shown[-1] == final, (shown, out)
