"""The cluster path on one machine: a real two-node Ray cluster, S3-compatible storage and an
MLflow server, all on loopback.

- a Ray head (this process is the driver, on the head's side);
- a second Ray node in a private mount namespace (``unshare -m``) where the head's project
  folders (``runs/``, ``mlflow.db``, ``mlartifacts/``, ``region_catalog/``) and this test
  session's temporary folders are hidden behind empty tmpfs mounts, so it sees what another
  machine would; only it has the custom resource ``optw_remote``, which the job's region
  workers ask for;
- a moto S3 server (storage and catalog by ``s3://`` URI) and a folder outside the hidden ones
  (standing in for NFS);
- an MLflow server with proxied artifacts, its store in a head-only folder.

Needs root (or user namespaces) for ``unshare -m``; skipped with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from ray import cloudpickle

from conftest import copy_catalog, good_tourist
from optw.distributed import JobProfile
from optw.distributed import mirror as mr
from optw.distributed import preflight as pf
from optw.distributed import storage as st
from optw.paths import PROJECT_ROOT
from optw.train.callbacks import Callback, TrainContext
from test_storage import AWS, moto_s3

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

REGIONS = ["r199", "pr99"]
RESOURCE = "optw_remote"
BUCKET = "optw-test"
#: The head's project folders the second node must not see.
HIDDEN = ("runs", "mlartifacts", "region_catalog")


def profile(name: str, epochs: int = 6, cpus: int = 1) -> JobProfile:
    """Both tiny regions with two a worker; a worker asking for ``cpus`` = 2 takes the whole
    second node, so the plan really packs them (one Ray Train worker, r199 first; with 1 CPU
    a worker the node's two slots get one region each)."""
    return JobProfile.from_dict({
        "job": {"name": name, "mode": "scratch", "regions": REGIONS},
        "train": {"epochs": epochs, "batch_size": 4, "val_every": 0, "val_tourists": 4,
                  "checkpoint_every": 2, "threads": 1},
        "evaluate": {"beams": 2, "validation_tourists": 4, "beam_sweep": [1, 2]},
        "resources": {"cpus_per_region": cpus, "max_failures": 2, "regions_per_worker": 2},
    }, source=f"test-{name}")


class PauseAfterCheckpoint(Callback):
    """Fault injection: after the first checkpoint, write this worker's pid and Ray node id to
    a marker file in the shared folder and sleep, so the test can SIGKILL it there."""

    def __init__(self, marker: str):
        self.marker = Path(marker)

    def on_epoch_end(self, ctx: TrainContext, metrics: dict[str, float]) -> None:
        import ray

        every = ctx.config.checkpoint_every
        if every and ctx.epoch == every and not self.marker.exists():
            node = ray.get_runtime_context().get_node_id()
            self.marker.write_text(f"{os.getpid()} {node}")
            time.sleep(120)


# Ray workers cannot import this test module: ship its classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ----------------------------------------------------------------------------- the cluster


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError(f"{what} not listening on {port} after {timeout:.0f} s")


def _stop_tree(proc: subprocess.Popen, timeout: float = 3) -> None:
    """Stop a ``ray start --block`` we started and every process under it (what ``ray stop``
    does, but only for these): SIGTERM to all, SIGKILL to what is left after ``timeout`` s."""
    import psutil

    try:
        parent = psutil.Process(proc.pid)
        tree = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(tree, timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def _address_file() -> Path:
    from ray._common.utils import get_ray_address_file

    return Path(get_ray_address_file(None))


def _restore_address_file(before: str | None, gcs: int) -> None:
    """``ray start --head`` records its head as this machine's current cluster, where
    ``address="auto"`` and Ray Train's placement-group cleaner (the State API) look: once our
    head is gone, put back what was there (a stale address hangs later Ray Tune runs)."""
    path = _address_file()
    now = path.read_text().strip() if path.is_file() else None
    if now is not None and now.endswith(f":{gcs}"):
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(before)


def _can_unshare() -> str | None:
    """Why a private mount namespace with a tmpfs cannot be made here (None: it can)."""
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare -m: {probe.stderr.strip()}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_catalog):
    """Head + hidden second node + moto S3 + MLflow server; yields a dict of what the tests
    need (URIs, folders). Everything is stopped by the pid this fixture started."""
    reason = _can_unshare()
    if reason:
        pytest.skip(reason)
    import ray

    from optw.distributed.rayenv import RAY_ENV, RUNTIME_ENV
    from optw.tracking.server import free_port, local_server

    base = tmp_path_factory.getbasetemp()  # hidden on the second node: head-only
    head = base / "head-only"
    head.mkdir()
    shared = Path(tempfile.mkdtemp(prefix="optw-nfs-"))  # outside every hidden folder
    assert base not in shared.parents
    ray_bin = str(Path(sys.executable).with_name("ray"))
    # the nodes authenticate like this process does (Ray reads it once, at its first use)
    auth = os.environ.get("RAY_AUTH_MODE") or "disabled"
    env = {**os.environ, **AWS, **RAY_ENV, "RAY_AUTH_MODE": auth,
           "OPTW_CACHE": str(head / "cache"), "OPTW_RUNS": str(head / "runs"),
           "PYTHONUNBUFFERED": "1"}
    for key in ("RAY_ADDRESS", "OPTW_STORAGE", "OPTW_CATALOG", "MLFLOW_TRACKING_URI"):
        env.pop(key, None)
    procs: list[subprocess.Popen] = []
    with contextlib.ExitStack() as stack, pytest.MonkeyPatch.context() as mp:
        stack.callback(shutil.rmtree, shared, ignore_errors=True)  # last, also on errors
        # -- S3 on loopback (a bucket of a moto server)
        bucket = stack.enter_context(moto_s3(BUCKET))
        # -- MLflow server, its store and artifacts on the head only
        server = stack.enter_context(local_server(
            backend_store_uri=f"sqlite:///{head / 'mlflow.db'}",
            artifacts_destination=head / "mlartifacts", log_file=head / "mlflow.log"))
        # -- the Ray head
        ports: set[int] = set()
        while len(ports) < 9:  # distinct, free now
            ports.add(free_port())
        gcs, *agent = sorted(ports)
        common = ["--node-ip-address=127.0.0.1", "--num-cpus=2", "--disable-usage-stats",
                  "--object-store-memory=200000000", "--block"]
        head_cmd = [ray_bin, "start", "--head", f"--port={gcs}", *common,
                    "--dashboard-host=127.0.0.1", f"--dashboard-port={agent[0]}",
                    f"--ray-client-server-port={agent[1]}",
                    f"--dashboard-agent-listen-port={agent[2]}",
                    f"--dashboard-agent-grpc-port={agent[3]}",
                    f"--runtime-env-agent-port={agent[4]}"]
        address_file = _address_file()
        before = address_file.read_text() if address_file.is_file() else None
        stack.callback(_restore_address_file, before, gcs)  # after the head has stopped
        log = open(head / "ray-head.log", "wb")  # noqa: SIM115 - closed by the stack
        stack.callback(log.close)
        procs.append(subprocess.Popen(head_cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        stack.callback(_stop_tree, procs[-1])
        _wait_port(gcs, procs[-1], "ray head")
        # -- the second node: the head's folders hidden, only it has RESOURCE
        mounts = [f"mount -t tmpfs tmpfs {shlex.quote(str(base))}"]
        for name in HIDDEN:
            if (PROJECT_ROOT / name).is_dir():
                mounts.append(f"mount -t tmpfs tmpfs {shlex.quote(str(PROJECT_ROOT / name))}")
        if (PROJECT_ROOT / "mlflow.db").is_file():
            mounts.append(f"mount --bind /dev/null {shlex.quote(str(PROJECT_ROOT / 'mlflow.db'))}")
        node_cmd = [ray_bin, "start", f"--address=127.0.0.1:{gcs}", *common,
                    f"--resources={{\"{RESOURCE}\": 2}}",
                    f"--dashboard-agent-listen-port={agent[5]}",
                    f"--dashboard-agent-grpc-port={agent[6]}",
                    f"--runtime-env-agent-port={agent[7]}"]
        script = "set -e; " + "; ".join(mounts) + "; exec " + shlex.join(node_cmd)
        node_log = open(shared / "ray-node.log", "wb")  # noqa: SIM115 - closed by the stack
        stack.callback(node_log.close)
        procs.append(subprocess.Popen(["unshare", "-m", "bash", "-c", script], env=env,
                                      stdout=node_log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        stack.callback(_stop_tree, procs[-1])
        # -- this process: the driver
        for key in (*AWS, "OPTW_CACHE", "OPTW_RUNS"):
            mp.setenv(key, env[key])
        for key in ("OPTW_STORAGE", "OPTW_CATALOG", "MLFLOW_TRACKING_URI", "RAY_ADDRESS"):
            mp.delenv(key, raising=False)
        if ray.is_initialized():  # an earlier module's local Ray: one instance at a time
            ray.shutdown()
        ray.init(address=f"127.0.0.1:{gcs}", logging_level="WARNING", runtime_env=RUNTIME_ENV)
        stack.callback(ray.shutdown)
        deadline = time.monotonic() + 120
        while len(pf.alive_nodes()) < 2:
            if time.monotonic() > deadline or procs[-1].poll() is not None:
                raise RuntimeError("the second node did not join: "
                                   + (shared / "ray-node.log").read_text()[-2000:])
            time.sleep(0.5)
        remote = next(n for n in pf.alive_nodes() if RESOURCE in n["Resources"])
        s3 = st.join(bucket, "optw")
        catalog = st.join(s3, "catalog")
        mr.upload_catalog(tiny_catalog.path, catalog)
        yield {"s3": s3, "catalog": catalog, "server": server, "head": head, "shared": shared,
               "remote_node": remote["NodeID"], "local_catalog": tiny_catalog.path}


# ----------------------------------------------------------------------------- tests


def test_second_node_sees_another_machine(cluster):
    """The second node really is blind to the head's folders: a task pinned to it finds the
    head-only folder and the project's runs/ empty, and the shared folder as the head wrote
    it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    (cluster["shared"] / "hello").write_text("from the head")
    (cluster["head"] / "secret").write_text("head only")

    def look(head: str, shared: str) -> tuple[bool, list[str], str]:
        return ((Path(head) / "secret").exists(),
                sorted(os.listdir(PROJECT_ROOT / "runs")) if (PROJECT_ROOT / "runs").is_dir()
                else [], (Path(shared) / "hello").read_text())

    pinned = NodeAffinitySchedulingStrategy(cluster["remote_node"], soft=False)
    seen = ray.get(ray.remote(num_cpus=0)(look).options(scheduling_strategy=pinned).remote(
        str(cluster["head"]), str(cluster["shared"])))
    assert seen == (False, [], "from the head")


def test_cluster_refuses_node_local_storage_sqlite_and_head_catalog(cluster, tmp_path,
                                                                   tiny_catalog):
    """On the two-node cluster the job refuses, before any training or MLflow run, each
    location the second node cannot reach, naming the setting to change: the default
    storage under the head's runs/, a head-local --out, a head-local catalog, a sqlite
    store, and an experiment whose artifacts go to the server's disk. A folder both nodes
    see passes the same check."""
    from optw.distributed.job import run_job
    from optw.tracking import TrackingUnavailableError, get_client

    server, s3, head = cluster["server"], cluster["s3"], cluster["head"]
    client = get_client(server)

    def refused(name: str, error: type[Exception], words: list[str], **kw) -> str:
        args = {"catalog_dir": cluster["catalog"], "tracking_uri": server,
                "storage": st.join(s3, "ray_train"), "out_dir": st.join(s3, name),
                "progress": False, "worker_resources": {RESOURCE: 1}, **kw}
        with pytest.raises(error) as exc:
            run_job(profile(name), **args)
        msg = str(exc.value)
        assert "\n" not in msg and all(w in msg for w in words), msg
        assert not st.exists(st.join(s3, "ray_train", name))  # Ray Train never started
        return msg

    # the defaults: runs/ray_train and runs/<job> on the head ($OPTW_RUNS is head-only here)
    msg = refused("refuse-default", pf.ClusterStorageError,
                  ["--storage (or OPTW_STORAGE)", cluster["remote_node"][:8], "2-node"],
                  storage=None, out_dir=None)
    assert str(head / "runs" / "ray_train") in msg
    refused("refuse-out", pf.ClusterStorageError, ["--out (or OPTW_STORAGE)"],
            out_dir=tmp_path / "out")
    refused("refuse-catalog", pf.ClusterStorageError, ["--catalog (or OPTW_CATALOG)"],
            catalog_dir=cluster["local_catalog"])
    db = tmp_path / "mlflow.db"
    refused("refuse-sqlite", TrackingUnavailableError,
            ["MLFLOW_TRACKING_URI", "--tracking-uri", "sqlite"], tracking_uri=f"sqlite:///{db}")
    assert not db.exists()
    for name in ("refuse-default", "refuse-out", "refuse-catalog", "refuse-sqlite"):
        assert client.get_experiment_by_name(name) is None
    # an experiment made with a file: artifact location (e.g. against the sqlite file)
    client.create_experiment("refuse-artifacts", artifact_location=(head / "arts").as_uri())
    refused("refuse-artifacts", TrackingUnavailableError, ["--name", "refuse-artifacts"])
    assert client.search_runs([client.get_experiment_by_name("refuse-artifacts")
                               .experiment_id]) == []
    # folders both nodes see (the NFS stand-in: storage, a catalog) and the S3 bucket pass
    shared_catalog = copy_catalog(tiny_catalog, cluster["shared"] / "catalog")
    assert pf.check_cluster([pf.Setting("--storage", str(cluster["shared"] / "ray_train")),
                             pf.Setting("--out", st.join(s3, "x")),
                             pf.Setting("--catalog", str(shared_catalog))], server) == 2


def test_two_node_job_with_killed_remote_worker(cluster, monkeypatch):
    """A tiny job on the two-node cluster, its pack's worker forced onto the hidden second
    node, storage and catalog in S3 (``$OPTW_STORAGE``, ``--catalog s3://``), MLflow over
    HTTP: killing that worker mid-run resumes it from the checkpoint in S3. Both regions
    train in that one worker, one after another: the restarted worker keeps r199's finished
    model instead of training it again, and pr99 (the plain one-region case: a running
    member) continues from its epoch-2 checkpoint. The checkpoints, final models, results,
    report, registered versions (loadable, region bundled) and their proxied artifacts all
    come out complete. (test_distributed's side-by-side pack covers the batched restart.)"""
    import pandas as pd
    import pyarrow.fs
    import torch

    from optw.distributed.job import run_job
    from optw.tracking import get_client, load_solver

    s3, server = cluster["s3"], cluster["server"]
    monkeypatch.setenv("OPTW_STORAGE", s3)
    marker = cluster["shared"] / "paused.pid"
    killed: dict[str, str] = {}

    def killer() -> None:
        deadline = time.time() + 240
        while time.time() < deadline and not marker.exists():
            time.sleep(0.2)
        if marker.exists():
            time.sleep(0.5)
            pid, node = marker.read_text().split()
            killed.update(node=node, ns=os.readlink(f"/proc/{pid}/ns/mnt"))
            os.kill(int(pid), signal.SIGKILL)
            killed["pid"] = pid

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    name = "two-node"
    summary = run_job(profile(name, cpus=2), catalog_dir=cluster["catalog"],
                      tracking_uri=server,
                      progress=False, worker_resources={RESOURCE: 1},
                      callbacks={"pr99": [PauseAfterCheckpoint(str(marker))]})
    thread.join(5)

    # the worker ran, and was killed, on the second node (its own mount namespace)
    assert killed.get("pid"), "the worker never reached its first checkpoint"
    assert killed["node"] == cluster["remote_node"]
    assert killed["ns"] != os.readlink("/proc/self/ns/mnt")
    assert sorted(summary.registered) == sorted(REGIONS)

    # everything the job wrote is in S3
    out, ray_train = st.join(s3, name), st.join(s3, "ray_train")
    assert summary.results_path == st.join(out, "results.parquet")
    assert summary.report == st.join(out, "report", "index.html")
    assert st.is_file(summary.report)
    with st.local_file(summary.results_path) as path:
        assert set(pd.read_parquet(path)["region"]) == set(REGIONS)
    fs, root = st.filesystem(ray_train)
    files = [i.path for i in fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=True))]
    packs = [p for p in files if p.endswith("/pack.json")]
    assert len(packs) >= 2, files  # every checkpoint of the pack, before and after the kill
    assert all("-pack2-" in p for p in packs), packs  # both regions in one worker
    for rid in REGIONS:
        with st.local_file(st.join(out, "models", f"scratch-{rid}.pt")) as path:
            assert torch.load(path, weights_only=True)["train"]["epoch"] == 6

    # MLflow: one version per region, loadable from the server alone; artifacts proxied
    client = get_client(server)
    for rid in REGIONS:
        versions = [v for v in client.search_model_versions(f"name = 'optw-{rid}'")
                    if v.tags.get("job") == name]
        assert len(versions) == 1
        run_id = versions[0].run_id
        assert [a.path for a in client.list_artifacts(run_id, "checkpoints")]
        # resumed, not restarted: no epoch is logged twice (r199 finished before the kill,
        # pr99 went on from its epoch-2 checkpoint)
        steps = [m.step for m in client.get_metric_history(run_id, "mean_reward")]
        assert steps and sorted(steps) == sorted(set(steps)), (rid, steps)
        solver = load_solver(f"models:/optw-{rid}/{versions[0].version}", uri=server)
        assert solver.region is not None and solver.region.id == rid
        assert len(solver.solve([good_tourist(solver.region)], method="greedy")) == 1
    assert [a.path for a in client.list_artifacts(summary.parent_run_id, "report")]
    assert any(p.is_file() for p in (cluster["head"] / "mlartifacts").rglob("*"))


def test_tune_runs_against_the_jobs_storage_uri(cluster, monkeypatch):
    """`optw tune` on the two-node cluster: Ray Tune's and every trial's
    Ray Train files go to the job's storage URI (``$OPTW_STORAGE``, S3), the catalog is given
    by URI (each trial's worker mirrors it on its own node), the early check passes, and the
    trial reports its gap to ILS. (One trial: the pick of the best is checked on a trials
    table in test_distributed.py::test_tune_picks_the_trial_closest_to_ils.)"""
    import dataclasses

    import pyarrow.fs

    from optw.distributed.tune import METRIC, run_sweep

    s3, server = cluster["s3"], cluster["server"]
    monkeypatch.setenv("OPTW_STORAGE", s3)
    base = profile("two-node-tune", epochs=4)
    base = dataclasses.replace(base, train=base.train.replace(val_every=2))
    res = run_sweep(base, ["r199"], num_samples=1,
                    space={"lr": ("choice", [1e-4, 1e-3]), "model.clip": ("choice", [5.0, 10.0])},
                    catalog_dir=cluster["catalog"], tracking_uri=server, progress=False,
                    name="two-node-tune")
    assert len(res.trials) == 1 and res.trials[METRIC].notna().all()
    assert set(res.best_trial) == {"lr", "model.clip"} and res.best_config["lr"] in (1e-4, 1e-3)
    assert res.best_gap == res.trials[METRIC].min()
    fs, root = st.filesystem(st.join(s3, "ray_tune"))
    files = [i.path for i in fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=True))]
    assert any(p.startswith(f"{root}/two-node-tune/") for p in files), files  # Tune's state
    assert any(p.endswith("/pack.json") for p in files), files  # the trials' checkpoints


def test_ils_task_mirrors_the_catalog_on_a_node_that_joined_late(cluster):
    """An ILS task scheduled on a node whose catalog mirror did not exist at
    the job's check (the second node's mirror is removed, as on a node that joined later, and
    the driver's mirror path is hidden there) mirrors the catalog URI on entry and returns its
    rows, which the driver writes to its own store."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from optw.baselines import load_ils_results, run_ils_baseline

    uri = cluster["catalog"]
    driver_mirror = mr.local_catalog(uri)  # this node's mirror (head-only, hidden there)
    pinned = NodeAffinitySchedulingStrategy(cluster["remote_node"], soft=False)

    def forget_mirror(uri: str) -> tuple[bool, bool]:
        mirror = mr.default_mirror(uri)
        shutil.rmtree(mirror, ignore_errors=True)
        return mirror.exists(), (mirror / "manifest.json").is_file()

    def has_mirror(uri: str) -> bool:
        return (mr.default_mirror(uri) / "manifest.json").is_file()

    remote = ray.remote(num_cpus=0)
    assert ray.get(remote(forget_mirror).options(scheduling_strategy=pinned).remote(uri)) \
        == (False, False)
    run = run_ils_baseline(driver_mirror, regions=["r199"], tourists="validation", workers=2,
                           progress=False, force=True, task_catalog=uri,
                           localize=mr.local_catalog, task_resources={RESOURCE: 1})
    assert run.computed == len(run.results) > 0
    assert ray.get(remote(has_mirror).options(scheduling_strategy=pinned).remote(uri))
    stored = load_ils_results(driver_mirror)
    # (earlier tests on this cluster may have stored r199's benchmark tourist)
    mine = (stored["region"] == "r199") & (stored["kind"] == "validation")
    assert mine.sum() == run.computed
