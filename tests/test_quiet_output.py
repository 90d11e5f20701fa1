"""`make run`'s output (``jobs/embedded.sh``): the job's own progress lines, warnings and
summary, not Ray's internals (Ray Train's report, checkpoint and worker-group lines, the raylet's
worker-start warnings, the job CLI's notes), which stay in Ray's log folder."""

from __future__ import annotations

import io
import os
import pickle
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import write_tiny_source
from optw.raylocal import temp_dir

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
#: the log folder jobs/embedded.sh names (Ray's temp folder: $RAY_TMPDIR/ray, else /tmp/ray)
RAY_LOGS = temp_dir() / "session_latest" / "logs"
TINY_PROFILE = """
[job]
name = "{name}"
mode = "scratch"
regions = {regions}
[train]
epochs = 4
batch_size = 4
val_every = 2
val_tourists = 4
checkpoint_every = 2
threads = 1
[finetune]
epochs = 2
[evaluate]
beams = 2
validation_tourists = 4
beam_sweep = [1, 2]
[resources]
cpus_per_region = 0.5
max_failures = 1
regions_per_worker = 1
"""

#: What Ray printed in `make run`'s output before it was made quiet (one pattern per kind).
RAY_INTERNALS = {
    "Ray Train report": r"Reporting training result|TrainingReport\(",
    "Ray Train checkpoint": r"Checkpoint successfully created|checkpoint_\d{4}-\d\d-\d\d_",
    "Ray Train (V1) iteration": r"Training finished iteration|Trial \w+ (started|completed)",
    "Ray Train worker group": r"Requesting resources|worker group|Setting up process group",
    "raylet worker-start warning": r"PYTHON worker processes have been started",
    "worker output prefix": r"\((\w+ )?pid=\d+(, ip=[\d.]+)?\)|\(raylet\)",
    "log deduplication note": r"repeated \d+x across cluster|Ray deduplicates logs",
    "Ray CLI record": r"\d{4}-\d\d-\d\d [\d:,]+\s+(INFO|SUCC|DEBUG) \w+\.py:\d+ --",
    "job CLI notes": r"Next steps|Tailing logs|Uploading package|Ignoring upload|"
                     r"is now ignored by default|Runtime env is setting up|Running entrypoint",
}


def tiny_job(tmp_path: Path, name: str, regions=("r199", "pr99", "t199")) -> tuple[dict, list]:
    """A tiny job for `jobs/embedded.sh`: its environment (profile) and arguments (a catalog of
    three tiny regions, an MLflow store and an output folder, all under ``tmp_path``)."""
    from optw.catalog import build_catalog

    build_catalog(write_tiny_source(tmp_path / "src"), tmp_path / "catalog")
    profile = tmp_path / f"{name}.toml"
    profile.write_text(TINY_PROFILE.format(name=name, regions=list(regions)).replace("'", '"'))
    env = {**os.environ, "PROFILE": str(profile), "OMP_NUM_THREADS": "1",
           "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}
    for var in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "KEEP_RAY"):
        env.pop(var, None)
    args = ["--catalog", str(tmp_path / "catalog"),
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
            "--out", str(tmp_path / "out")]
    return env, args


def ray_running(env: dict) -> bool:
    """Is a Ray cluster already up on this machine (the one embedded.sh would join)?"""
    proc = subprocess.run([str(BIN / "ray"), "status"], env=env, capture_output=True,
                          timeout=60)
    return proc.returncode == 0


def stop_ray(env: dict) -> None:
    subprocess.run([str(BIN / "ray"), "stop", "--force"], env=env, capture_output=True,
                   timeout=120)


def run_embedded(tmp_path: Path, env: dict, args: list) -> str:
    """Run `jobs/embedded.sh` with ``env`` and ``args``, stop the Ray head it leaves, keep its
    output in ``tmp_path/output.txt``; the output once the script succeeded."""
    try:
        proc = subprocess.run(["bash", str(ROOT / "jobs" / "embedded.sh"), *args], env=env,
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=600)
    finally:
        stop_ray(env)
    (tmp_path / "output.txt").write_text(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc.stdout


def test_embedded_job_output_is_ours_not_rays(tmp_path):
    """A tiny job through `jobs/embedded.sh` (what `make run` runs: a local Ray head,
    `ray job submit`, the job's logs followed): the output holds the job's own lines (its
    start line, stage progress, summary table, where to look) and none of Ray's internals
    (RAY_INTERNALS); those are in Ray's log folder, which the output names."""
    env, args = tiny_job(tmp_path, "quiet-output")
    if ray_running(env):
        pytest.skip("a Ray cluster is already running here; embedded.sh would join it")
    t0 = time.monotonic()
    out = run_embedded(tmp_path, env, args)
    # ours: the job's lines, its progress and its summary
    for line in (r"starting a local Ray head",
                 rf"job optw-\S+ submitted; Ray's logs: {re.escape(str(RAY_LOGS))}",
                 r"job quiet-output: mode scratch, 3 regions, 3 models, \d+ at a time",
                 r"stage scratch: 100%",
                 r"job quiet-output: 3 model\(s\) trained, 0 region\(s\) skipped",
                 r"solomon +validation +model_greedy",
                 r"time: [\d.]+ min wall",
                 rf"results: {re.escape(str(tmp_path))}/out/results.parquet",
                 r"MLflow: parent run \w+ in experiment 'quiet-output'",
                 r"done in \d+ s\.",
                 r"stopping the local Ray head"):
        assert re.search(line, out, re.M), f"missing {line!r} in:\n{out}"
    # not Ray's
    for kind, pattern in RAY_INTERNALS.items():
        hits = [x for x in out.splitlines() if re.search(pattern, x)]
        assert not hits, f"{kind} in the output: {hits[:3]}"
    # Ray's lines are in its log folder: the job's whole output, Ray Train's report lines
    job_id = re.search(r"job (optw-\S+) submitted", out).group(1)
    driver = RAY_LOGS / f"job-driver-{job_id}.log"
    assert "job quiet-output: 3 model(s) trained" in driver.read_text()
    train_logs = "".join(p.read_text(errors="replace") for p in (RAY_LOGS / "train").glob("*"))
    assert "Reporting training result" in train_logs
    raylet = (RAY_LOGS / "raylet.out").read_text(errors="replace")
    print(f"{time.monotonic() - t0:.0f} s; raylet worker-start warnings in raylet.out: "
          f"{raylet.count('PYTHON worker processes have been started')}")


def test_worker_restart_still_shows(capsys):
    """A failed worker is not hidden with Ray Train's INFO lines: every trainer the job makes
    carries a callback (run in Ray Train's controller, pickled there) that prints one warning
    line per failure, saying whether Ray Train restarts the worker or the run fails."""
    from optw.distributed.profile import ResourcesSection
    from optw.distributed.ray_train import WorkerSpec, make_trainer
    from optw.train.config import TrainConfig

    spec = WorkerSpec(TrainConfig(regions=["r199"], epochs=2), "r199", "scratch", "cat",
                      "sqlite:///x.db", None)
    trainer = make_trainer(spec, str(Path("/tmp")), "restart-run",
                           ResourcesSection(max_failures=1), use_gpu=False)
    run_config = trainer.run_config
    assert run_config.logging_config.log_level == "WARNING"
    (notice,) = [c for c in run_config.callbacks if type(c).__name__ == "RestartNotice"]
    notice = pickle.loads(pickle.dumps(notice))
    for _ in range(2):
        notice.after_exception(None, {0: RuntimeError("The actor died unexpectedly.\nmore")})
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "warning: a worker of restart-run failed (RuntimeError: The actor died unexpectedly.); "
        "Ray Train restarts it from its last checkpoint (restart 1 of 1)",
        "warning: a worker of restart-run failed (RuntimeError: The actor died unexpectedly.); "
        "no restarts left: the run fails"]


def test_driver_drops_only_rays_worker_start_warning():
    """The one filter of Ray's lines (optw.raylogs, used by `optw job run`,
    jobs/train_all.py and the follower) drops the raylet's worker-start warning line, even
    when written in pieces and across threads' flushes, and passes everything else."""
    from optw.raylogs import DropLines

    sink = io.StringIO()
    out = DropLines(sink)
    warning = ("\x1b[33m(raylet)\x1b[0m WARNING: 8 PYTHON worker processes have been started "
               "on node: 9093 with address: 192.0.2.2, which is 4x the maximum expected "
               "startup concurrency (2).")
    print("job x: mode scratch", file=out)
    out.write(warning)
    out.flush()  # another thread's flush between print's two writes
    out.write("\n")
    print("\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task", file=out)
    out.write("stage scratch:  50%")
    out.flush()
    assert sink.getvalue() == ("job x: mode scratch\n\n\x1b[33m(raylet)\x1b[0m A worker died or "
                               "was killed while executing a task\nstage scratch:  50%")
