"""`make run`'s output (``jobs/embedded.sh``): the job's own progress lines, warnings and
summary, not Ray's internals (Ray Train's report, checkpoint and worker-group lines, the raylet's
worker-start warnings, the job CLI's notes), which stay in Ray's log folder. The script's run
itself is checked in test_embedded.py (one run for three tests); here: the filters, and the
helpers that run uses."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

from conftest import write_tiny_source

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
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
# one worker slot on embedded.sh's head (`nproc` CPUs: 1 here, the job's OMP_NUM_THREADS=1):
# the three regions train in one worker, one after another (one Ray Train run; a worker
# process each cost more than their training)
cpus_per_region = 1
max_failures = 1
regions_per_worker = 3
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
