"""`optw solve --active-search N` shows its progress: a callback of
active search called once per epoch, and a tqdm bar on stderr only when stderr is a terminal
or ``--progress`` asks, so piped output is unchanged."""

from __future__ import annotations

import json

import torch

from optw.cli import main
from optw.decode.active_search import active_search
from optw.decode.solve import solve
from optw.env.instances import make_instances
from optw.model import ModelConfig, PointerNet
from optw.model.checkpoint import save_model


def _untrained() -> PointerNet:
    torch.manual_seed(7)
    return PointerNet(ModelConfig()).eval()


def test_active_search_calls_progress_once_per_epoch(tiny_catalog):
    """`active_search(progress=...)` is called exactly ``epochs`` times with the best reward
    sampled in each epoch; `solve` passes it on with the tourist's index."""
    region = tiny_catalog.region("r199")
    tourists = tiny_catalog.validation("r199")[:2]
    seen: list[float] = []
    active_search(_untrained(), make_instances(region, tourists[:1], "cpu"), epochs=5,
                  batch_size=4, beams=2, progress=seen.append)
    assert len(seen) == 5 and all(isinstance(r, float) and r >= 0 for r in seen)
    calls: list[tuple[int, float]] = []
    solve(_untrained(), region, tourists, "active_search", epochs=3, batch_size=4, beams=2,
          progress=lambda k, r: calls.append((k, r)))
    assert [k for k, _ in calls] == [0, 0, 0, 1, 1, 1]


def test_solve_bar_only_on_a_terminal_or_when_asked(tiny_catalog, tmp_path, capsys):
    """`optw solve --active-search 3 --progress` draws a bar on stderr (epochs done, best score
    so far); without a terminal and without `--progress` stderr stays empty, and stdout is the
    same either way."""
    model = save_model(_untrained(), tmp_path / "model.pt")
    argv = ["solve", "--region", "r199", "--checkpoint", str(model), "--active-search", "3",
            "--beams", "2", "--catalog", str(tiny_catalog.path),
            "--json", "--threads", "1"]
    assert main(argv) in (0, None)
    quiet = capsys.readouterr()
    assert quiet.err == ""
    assert main([*argv, "--progress"]) in (0, None)
    shown = capsys.readouterr()
    n = len(tiny_catalog.benchmark("r199").tourist_id)
    assert "active search" in shown.err and f"{3 * n}/{3 * n}" in shown.err
    assert "best=" in shown.err
    assert _answers(shown.out) == _answers(quiet.out) and len(_answers(quiet.out)) == n


def _answers(out: str) -> list[dict]:
    """The JSON lines of `optw solve --json`, without their wall times."""
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in out.splitlines()]
