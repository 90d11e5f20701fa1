"""Job storage locations (optw.distributed.storage, the catalog mirror) against a real
S3-compatible server on loopback (moto), and the early cluster checks (preflight) that need
no cluster: a single node, an autoscaling cluster, the tracking store and artifact location
rules."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import stop_process
from optw.distributed import mirror as mr
from optw.distributed import preflight as pf
from optw.distributed import storage as st

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


@contextlib.contextmanager
def moto_s3(bucket: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """A moto S3 server on loopback with ``bucket`` made; yields ``s3://<bucket>?<query>``
    (endpoint, scheme and region in the query, credentials from the ``AWS_*`` variables)."""
    import socket

    import pyarrow.fs

    from optw.tracking.server import free_port

    port = free_port()
    moto = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H",
                             "127.0.0.1", "-p", str(port)],
                            env={**os.environ, **AWS, **(env or {})}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if moto.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto_server did not start (exit {moto.poll()})")
            time.sleep(0.2)
        pyarrow.fs.S3FileSystem(access_key=AWS["AWS_ACCESS_KEY_ID"],
                                secret_key=AWS["AWS_SECRET_ACCESS_KEY"],
                                endpoint_override=f"127.0.0.1:{port}", scheme="http",
                                region="us-east-1", allow_bucket_creation=True
                                ).create_dir(bucket)
        yield f"s3://{bucket}?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    finally:
        stop_process(moto)


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as mp:
        for key, value in AWS.items():
            mp.setenv(key, value)
        with moto_s3("optw-unit") as uri:
            yield uri


def test_locations_and_their_defaults(monkeypatch, tmp_path):
    """Paths and URIs are told apart (file:// is a path), a URI keeps its query when joined,
    and $OPTW_STORAGE moves Ray Train's storage and the job outputs together (runs/ without
    it, as before)."""
    from optw import paths

    uri = "s3://b/p/?endpoint_override=h:1&scheme=http"
    assert st.is_uri(uri) and not st.is_uri("/x/y") and not st.is_uri("file:///x/y")
    assert st.normalize("file:///x/y/") == "/x/y" and st.normalize(uri) == uri.replace("/?", "?")
    assert st.join(uri, "ray_train", "a.pt") == "s3://b/p/ray_train/a.pt?" \
        "endpoint_override=h:1&scheme=http"
    assert st.join("/x", "y") == "/x/y" and st.local_path(uri) is None
    secret = "s3://b/p?endpoint_override=h:1&access_key=AK&secret_key=SK"
    assert st.shown(secret) == "s3://b/p?endpoint_override=h:1&access_key=***&secret_key=***"
    assert st.shown(uri) == uri and st.shown("/x/y") == "/x/y"
    monkeypatch.delenv("OPTW_STORAGE", raising=False)
    monkeypatch.setenv("OPTW_RUNS", str(tmp_path))
    assert paths.train_storage() == str(tmp_path / "ray_train")
    assert paths.job_output("j") == str(tmp_path / "j")
    assert paths.cache_dir() == tmp_path / ".cache"
    monkeypatch.setenv("OPTW_STORAGE", "s3://bucket/optw")
    assert paths.train_storage() == "s3://bucket/optw/ray_train"
    assert paths.job_output("j") == "s3://bucket/optw/j"
    monkeypatch.setenv("OPTW_CATALOG", "s3://bucket/optw/catalog")
    assert paths.catalog_location() == "s3://bucket/optw/catalog"


def test_s3_files_folders_and_errors(s3, tmp_path):
    """Files go to S3 and back whole; a temporary download disappears after its block; a
    missing bucket or a file where a folder belongs is one line naming the setting."""
    src = tmp_path / "model.pt"
    src.write_bytes(b"x" * 1000)
    (out,) = st.prepare_folders([("--out", st.join(s3, "job"))])
    target = st.put_file(src, st.join(out, "models", "a.pt"))
    assert st.is_file(target) and not st.is_file(st.join(out, "models"))
    with st.local_file(target) as path:
        assert path.read_bytes() == src.read_bytes()
    assert not path.exists()
    assert st.get_file(target, tmp_path / "back.pt").read_bytes() == src.read_bytes()
    missing = s3.replace("s3://optw-unit", "s3://no-such-bucket")
    with pytest.raises(st.StorageError) as exc:
        st.prepare_folders([("--storage (or OPTW_STORAGE)", missing)])
    assert "\n" not in str(exc.value) and "--storage (or OPTW_STORAGE)" in str(exc.value)
    with pytest.raises(NotADirectoryError, match="--out"):
        st.prepare_folders([("--out", target)])
    with pytest.raises(NotADirectoryError, match="--out"):
        st.prepare_folders([("--out", src)])


def test_catalog_by_uri_is_mirrored_and_kept_current(s3, tiny_catalog, tmp_path):
    """A catalog published at a URI (once per build) opens through a node-local mirror; ILS
    results pushed back by a job reach the next mirror update, files gone from the URI leave
    the mirror, and probe files of the cluster check are never copied."""
    from optw.catalog import open_catalog

    uri = st.join(s3, "catalog")
    assert mr.upload_catalog(tiny_catalog.path, uri) is True
    assert mr.upload_catalog(tiny_catalog.path, uri) is False  # the same build: nothing to do
    st.write_bytes(st.join(uri, f"{mr.PROBE_PREFIX}x"), b"probe")
    mirror = Path(mr.local_catalog(uri, tmp_path / "mirror"))
    assert open_catalog(mirror).regions_table.index.tolist() == \
        tiny_catalog.regions_table.index.tolist()
    assert not list(mirror.glob(f"{mr.PROBE_PREFIX}*"))
    # a job adds ILS results in its own mirror and pushes them back; another mirror gets them
    (mirror / "baselines").mkdir(exist_ok=True)
    (mirror / "baselines" / "ils.parquet").write_bytes(b"new results")
    mr.push_baselines(mirror, uri)
    other = Path(mr.local_catalog(uri, tmp_path / "other"))
    assert (other / "baselines" / "ils.parquet").read_bytes() == b"new results"
    st.delete(st.join(uri, "baselines", "ils.parquet"))
    mr.local_catalog(uri, other)
    assert not (other / "baselines" / "ils.parquet").exists()
    with pytest.raises(FileNotFoundError, match="no files"):
        mr.local_catalog(st.join(s3, "nothing-here"), tmp_path / "none")


def test_trainer_gets_remote_storage_and_worker_resources(s3):
    """make_trainer hands Ray Train an S3 location as (path, pyarrow filesystem), adds custom
    resources to the worker's request, and runs the one worker function on the typed pack
    (no config dict) and where to leave an error meant for the user (beside the run, in the
    same storage); a catalog given by URI travels as the URI (the worker mirrors it on its own
    node on entry); a local folder stays a path."""
    import functools

    import pyarrow.fs

    from optw.distributed.profile import ResourcesSection
    from optw.distributed.ray_train import WorkerPack, WorkerSpec, make_trainer, train_worker
    from optw.train import TrainConfig

    spec = WorkerSpec(TrainConfig(regions=["r199"]), "r199", "scratch", "/data/catalog",
                      "http://127.0.0.1:5000", None)
    res = ResourcesSection(cpus_per_region=1)
    trainer = make_trainer(spec, st.join(s3, "ray_train"), "n", res, use_gpu=False,
                           worker_resources={"optw_remote": 1})
    run = trainer.run_config
    assert run.storage_path == "optw-unit/ray_train"
    assert isinstance(run.storage_filesystem, pyarrow.fs.S3FileSystem)
    assert trainer.scaling_config.resources_per_worker == {"CPU": 1, "optw_remote": 1.0}
    worker = trainer.train_loop_per_worker
    assert isinstance(worker, functools.partial) and worker.func is train_worker
    assert worker.args == (WorkerPack((spec,), batched=False),
                           st.join(s3, "ray_train", ".n.optw-error"))
    assert not trainer.train_loop_config
    uri = st.join(s3, "catalog")
    remote = make_trainer(dataclasses.replace(spec, catalog=uri), "/tmp/x", "n", res,
                          use_gpu=False)
    assert remote.train_loop_per_worker.func is train_worker
    assert remote.train_loop_per_worker.args[0].specs[0].catalog == uri
    assert remote.run_config.storage_path == "/tmp/x"
    assert remote.run_config.storage_filesystem is None


def test_cluster_checks_without_a_cluster(tmp_path):
    """One node and no autoscaler: nothing is checked (the single-node default is
    unchanged). A cluster the autoscaler grows refuses a sqlite store and a folder on the
    node's own disk, naming the setting; an S3 location passes."""
    from optw.tracking import TrackingUnavailableError

    one = [{"NodeID": "a" * 56, "NodeManagerAddress": "127.0.0.1", "Alive": True}]
    local = [pf.Setting("--storage (or OPTW_STORAGE)", str(tmp_path))]
    sqlite = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert pf.check_cluster(local, sqlite, nodes=one, autoscaling=0) == 1
    with pytest.raises(TrackingUnavailableError, match="MLFLOW_TRACKING_URI"):
        pf.check_cluster(local, sqlite, nodes=one, autoscaling=3)
    with pytest.raises(pf.ClusterStorageError) as exc:
        pf.check_cluster(local, "http://127.0.0.1:5000", nodes=one, autoscaling=3)
    msg = str(exc.value)
    assert "\n" not in msg and "--storage (or OPTW_STORAGE)" in msg and "up to 3" in msg
    remote = [pf.Setting("--storage", "s3://bucket/optw")]
    assert pf.check_cluster(remote, "http://127.0.0.1:5000", nodes=one, autoscaling=3) == 4
    config = tmp_path / "ray_bootstrap_config.yaml"
    assert pf.autoscaling_workers(config) == 0
    config.write_text("cluster_name: x\nmax_workers: 8\n")
    assert pf.autoscaling_workers(config) == 8
    assert pf.network_fs(tmp_path) is None


def test_tracking_rules_for_a_cluster(tmp_path):
    """On several nodes a sqlite file or a file store is refused naming MLFLOW_TRACKING_URI, a
    server passes; an experiment whose artifacts go to a file: location is refused naming
    --name, a proxied one passes."""
    from optw.tracking import (
        TrackingUnavailableError,
        check_artifact_location,
        check_cluster_tracking,
        get_client,
    )

    for uri in (f"sqlite:///{tmp_path / 'x.db'}", str(tmp_path / "mlruns"),
                (tmp_path / "mlruns").as_uri()):
        with pytest.raises(TrackingUnavailableError) as exc:
            check_cluster_tracking(uri, 3)
        assert "MLFLOW_TRACKING_URI" in str(exc.value) and "\n" not in str(exc.value)
    assert check_cluster_tracking("http://head:5000", 3) == "http://head:5000"
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = get_client(store)
    client.create_experiment("on-disk", artifact_location=(tmp_path / "art").as_uri())
    client.create_experiment("proxied", artifact_location="mlflow-artifacts:/proxied")
    with pytest.raises(TrackingUnavailableError, match="--name"):
        check_artifact_location(store, "on-disk", 2)
    check_artifact_location(store, "proxied", 2)
    check_artifact_location(store, "not-made-yet", 2)


def test_worker_resources_option():
    """--worker-resources NAME=AMOUNT,... is parsed and checked with one-line errors."""
    from optw.distributed.cli import resource_amounts

    assert resource_amounts(None) == {}
    assert resource_amounts("trainer=1, big=0.5") == {"trainer": 1.0, "big": 0.5}
    for bad in ("trainer", "trainer=0", "=1", "trainer=x", "trainer=inf", ","):
        with pytest.raises(ValueError, match="--worker-resources"):
            resource_amounts(bad)
