"""Shared fixtures: the project's built catalog and tiny synthetic regions.

Tiny regions are written by the tests themselves in the benchmark formats (synthetic data, no
benchmark content), so model and training tests run in seconds.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from optw.catalog import Catalog, CatalogError, build_catalog, default_catalog_dir, default_source
from optw.catalog.store import FILES
from optw.model import CHECK_ENV

# Every checkpoint written in the tests (Ray workers inherit this) proves it loads back with
# torch.load(weights_only=True).
os.environ[CHECK_ENV] = "1"


def write_toptw(path: Path, n_points: int, seed: int, t_end: float = 400.0,
                decimals_box: float = 50.0) -> Path:
    """A synthetic Solomon/Cordeau-format instance with ``n_points`` points."""
    rng = np.random.default_rng(seed)
    lines = [f"1 1 {n_points} 1", "0 200", f"0 {decimals_box / 2:.2f} {decimals_box / 2:.2f} "
             f"0.00 0.00 0 0 0 {t_end:g}"]
    for i in range(1, n_points + 1):
        x, y = rng.uniform(0, decimals_box, 2)
        d = float(rng.integers(5, 20))
        s = float(rng.integers(1, 30))
        o = float(rng.integers(0, int(t_end * 0.6)))
        c = o + float(rng.integers(30, int(t_end * 0.5)))
        lines.append(f"{i} {x:.2f} {y:.2f} {d:.2f} {s:.2f} 1 1 1 {o:g} {c:g}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def write_ttdp(path: Path, n_points: int, seed: int, day: int = 2) -> Path:
    """A synthetic single-day Gavalas-format instance."""
    rng = np.random.default_rng(seed)
    lines = [f"20 1 {day} {n_points} 9 250" + " 10" * 10, "0 50 50 0 0 480 1080"]
    for i in range(1, n_points + 1):
        x, y = rng.uniform(0, 100, 2)
        d = int(rng.integers(10, 90))
        s = int(rng.integers(1, 30))
        windows = []
        for _ in range(7):
            o = int(rng.integers(0, 600))
            windows += [o, o + int(rng.integers(120, 800))]
        lines.append(f"{i} {x:.2f} {y:.2f} {d} {s} 1 " + " ".join(map(str, windows)) + " 0")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def write_tiny_source(root: Path) -> Path:
    """Three tiny regions, one per group: r199 (10 points), pr99 (14), t199 (12)."""
    write_toptw(root / "solomon" / "r199.txt", 10, seed=1, t_end=230.0)
    write_toptw(root / "cordeau" / "pr99.txt", 14, seed=2, t_end=500.0)
    write_ttdp(root / "gavalas" / "t199.txt", 12, seed=3)
    return root


#: A pretraining profile (``optw pretrain``) for the tiny regions: steps of 8 routes, a curve
#: point every 2 epochs on t199, a cool-down of at most 2 epochs.
TINY_PRETRAIN_PROFILE = """
[train]
recipe = "fast"
mix_regions = true
tourists_per_epoch = 2
batch_size = 4
lr = 5e-4
lr_schedule = "step"
lr_decay = 1.0
warmup_epochs = 2
epochs = 1000
threads = 1

[pretrain]
checkpoint_every = 1
curve_every = 2
curve_tourists = 3
beams = 2
cooldown = 0.5
cooldown_max = 2

[pretrain.curve_regions]
gavalas = ["t199"]
"""


#: Modules that start Ray (a local instance, `ray start`, Ray Serve, ILS on Ray workers, a job)
#: or stop it. RAY_ALONE stop every Ray of the machine (`ray stop`) or start `ray start` heads:
#: no other Ray module runs meanwhile (:func:`ray_turn`). RAY_SHARED start local Ray instances
#: of their own, which run beside another one (free ports; a job passes its address on); they
#: are listed longest first.
RAY_ALONE = ("test_embedded", "test_fresh_machine", "test_quiet_output", "test_two_node")
RAY_SHARED = ("test_distributed", "test_custom_job", "test_serve", "test_dashboards",
              "test_planner_page", "test_raylogs", "test_ils", "test_report_job",
              "test_serve_cli", "test_serve_latlon", "test_examples", "test_release_job",
              "test_preflight")
RAY_MODULES = frozenset(RAY_ALONE + RAY_SHARED)
#: Modules that serve on README's fixed port 8000: one scope, so they run one after another.
PORT_8000 = ("test_serve_cli", "test_examples")


def xdist_scope(module: str) -> str:
    """The pytest-xdist scope of a test module (its file's stem): its own, or its group's."""
    return "ray-alone" if module in RAY_ALONE else "port-8000" if module in PORT_8000 else module


class RayModulesApart:
    """pytest-xdist's scheduler for this suite: a scope per module (its module fixtures run
    once), RAY_ALONE and PORT_8000 one scope each. The first worker starts with RAY_ALONE,
    the others with the modules without Ray; then each worker takes the longest Ray module
    left, then any module."""

    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        from xdist.scheduler import LoadScopeScheduling

        shared = [xdist_scope(m) for m in RAY_SHARED]

        def rank(scope: str, first: bool) -> tuple[int, int]:
            if scope == "ray-alone":
                return (0 if first else 3, 0)
            if scope in shared:
                return (1 if first else 2, shared.index(scope))
            return (2 if first else 1, 0)  # without Ray: the queue's order (largest first)

        class Scheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return xdist_scope(Path(nodeid.split("::", 1)[0]).stem)

            def _assign_work_unit(self, node) -> None:
                first = node is self.nodes[0]
                best = min(self.workqueue, key=lambda scope: rank(scope, first))
                self.workqueue.move_to_end(best, last=False)
                super()._assign_work_unit(node)

        return Scheduling(config, log)


def pytest_configure(config) -> None:
    if config.pluginmanager.hasplugin("xdist"):  # its hook exists only with xdist installed
        config.pluginmanager.register(RayModulesApart(), "optw-ray-modules-apart")


@pytest.fixture(scope="module", autouse=True)
def ray_turn(request, tmp_path_factory) -> Iterator[None]:
    """A Ray module's turn: RAY_ALONE modules hold the test run's Ray lock alone, the others
    share it, so no Ray module runs beside one that stops every Ray of the machine. Ray
    started in this process is shut down at the module's end."""
    module = Path(request.path).stem
    if module not in RAY_MODULES:
        yield
        return
    import fcntl
    import sys

    # the workers' temporary folders share their parent (pytest-xdist's popen-gwN)
    with open(tmp_path_factory.getbasetemp().parent / "optw-ray.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if module in RAY_ALONE else fcntl.LOCK_SH)
        try:
            yield
        finally:
            ray = sys.modules.get("ray")
            if ray is not None and ray.is_initialized():
                ray.shutdown()
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    """The project's catalog of the 109 benchmark regions (built here if missing)."""
    try:
        return Catalog()
    except CatalogError:
        if not default_source().is_dir():
            pytest.skip(f"benchmark files not found at {default_source()}")
        build_catalog(out=default_catalog_dir())
        return Catalog()


@pytest.fixture(scope="session")
def tiny_catalog(tmp_path_factory) -> Catalog:
    """A catalog of three tiny synthetic regions (r199, pr99, t199)."""
    root = tmp_path_factory.mktemp("tiny")
    src = write_tiny_source(root / "src")
    build_catalog(src, root / "catalog")
    return Catalog(root / "catalog")


@pytest.fixture(scope="session")
def output_dir() -> Path:
    """Folder for artefacts a person may want to look at (screenshots, reports)."""
    default = Path(__file__).resolve().parents[1] / "test-output"
    out = Path(os.environ.get("OPTW_TEST_OUTPUT", default))
    out.mkdir(parents=True, exist_ok=True)
    return out


def stop_process(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Terminate a helper process a test started (kill it if it does not exit in time)."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


def copy_catalog(cat: Catalog, dst: Path) -> Path:
    """A private copy of a built catalog (Parquet files, the paper sets if it has them, and
    the manifest) at ``dst``."""
    import shutil

    dst.mkdir(parents=True)
    for name in (*cat.manifest.get("files", FILES), "manifest.json"):
        shutil.copy(cat.path / name, dst / name)
    return dst


# ----------------------------------------------------------------------------- bad tourists
# The generated bad-tourist family, shared by the tests of every entry point that reads
# tourists (catalog reader, optw solve, the planner, the MLflow pyfunc).


def good_tourist(region) -> dict:
    """A valid tourist of ``region`` (a catalog ``Region``) in the JSON format: string id,
    benchmark start and times, score 1 per point."""
    return {"tourist": "alice", "start": list(region.start_xy), "t_start": region.t_start,
            "t_end": region.t_end, "scores": [1.0] * region.n_points}


def tourist_with(tourist: dict, path: str, value) -> dict:
    """A copy of ``tourist`` with ``value`` at ``path`` ("t_end", "start.x", "scores[3]")."""
    import copy

    out = copy.deepcopy(tourist)
    if path.startswith("start."):
        out["start"]["xy".index(path[-1])] = value
    elif path.startswith("scores["):
        out["scores"][int(path[7:-1])] = value
    else:
        out[path] = value
    return out


def bad_tourists(region, required: bool = True) -> list[tuple[str, dict, str]]:
    """A generated family of bad tourists of ``region``: (case id, tourist dict, the field its
    error must name). Every numeric field gets NaN, ±inf, a bool, a string, a list and an int too
    large for a float; then absurd coordinates and times, negative and too large scores, wrong
    score counts and shapes, bad starts and ids, unknown fields, ``t_end <= t_start`` and (with
    ``required``, for readers without defaults) each required field left out."""
    import math

    from optw.catalog.tourist_json import REQUIRED_FIELDS, SCORE_LIMIT, start_box

    good, n = good_tourist(region), region.n_points
    cases: list[tuple[str, dict, str]] = []
    numbers = ["start.x", "start.y", "t_start", "t_end", "scores[0]", f"scores[{n // 2}]",
               f"scores[{n - 1}]"]
    odd = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "true": True, "false": False,
           "string": "1", "list": [1], "object": {"v": 1}, "int-overflow": 10**400}
    for path in numbers:
        cases += [(f"{path}={name}", tourist_with(good, path, v), path)
                  for name, v in odd.items()]
    (x_lo, x_hi), (y_lo, y_hi) = start_box(region)
    for path, lo, hi in (("start.x", x_lo, x_hi), ("start.y", y_lo, y_hi)):
        cases += [(f"{path}={v:g}", tourist_with(good, path, v), path)
                  for v in (lo - 1, hi + 1, 1e300, -1e300)]
    for path in ("t_start", "t_end"):
        cases += [(f"{path}={v:g}", tourist_with(good, path, v), path)
                  for v in (-3 * region.t_max, 3 * region.t_max, 1e300)]
    for k in (0, n // 2, n - 1):
        cases += [(f"scores[{k}]={v:g}", tourist_with(good, f"scores[{k}]", v), f"scores[{k}]")
                  for v in (-1, -1e-9, SCORE_LIMIT * 10)]
    for count in (0, 1, n - 1, n + 1, n + 3):
        cases.append((f"scores-count-{count}", {**good, "scores": [1.0] * count}, "scores"))
    for name, v in (("string", "1,2"), ("object", {"a": 1}), ("number", 5), ("nested", [[1]] * n)):
        cases.append((f"scores-{name}", {**good, "scores": v},
                      "scores[0]" if name == "nested" else "scores"))
    for name, v in (("one", [1]), ("three", [1, 2, 3]), ("string", "1,2"), ("x-only", {"x": 1}),
                    ("xyz", {"x": 1, "y": 2, "z": 3}), ("number", 5)):
        cases.append((f"start-{name}", {**good, "start": v}, "start"))
    for key in ("foo", "Start", "start_x", "tourists", "scores_"):
        cases.append((f"unknown-{key}", {**good, key: 1}, key))
    ts, te = good["t_start"], good["t_end"]
    cases += [("t_end=t_start", {**good, "t_end": ts}, "t_end"),
              ("t_end<t_start", {**good, "t_end": ts - 1}, "t_end"),
              ("t_start=t_end", {**good, "t_start": te}, "t_end")]
    for name, v in (("true", True), ("float", 1.5), ("empty", ""), ("list", ["a"]),
                    ("long", "x" * 1000)):
        cases.append((f"id-{name}", {**good, "tourist": v}, "tourist"))
    if required:
        for key in REQUIRED_FIELDS:
            cases.append((f"missing-{key}", {k: v for k, v in good.items() if k != key}, key))
            cases.append((f"null-{key}", {**good, key: None}, key))
    return cases


def assert_names_field(message: str, field: str) -> None:
    """One line that names ``field`` as ``<field>: ...``."""
    assert "\n" not in message.strip() and f"{field}:" in message, (field, message)


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Torch in the test process runs one thread (tests that choose threads say so): every
    comparison a test makes is within the process, and on a busy machine two OpenMP threads
    spin against each other and the other work (a pack test took 219 s beside a benchmark,
    5 s on one thread)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def ray_token():
    """Every local Ray cluster the tests start finds Ray's token, made once when missing, as
    the project's own entry points do (``optw.raylocal.ensure_token``): no test depends on
    which test ran first. ``tests/test_fresh_machine.py`` checks the entry points themselves."""
    from optw.raylocal import ensure_token

    ensure_token(say=None)


@contextlib.contextmanager
def local_ray(num_cpus: int = 2, dashboard: bool = False,
              object_store_mb: int = 200) -> Iterator[object]:
    """A local Ray started the way the product starts one
    (:func:`optw.distributed.rayenv.connect`): :data:`~optw.distributed.rayenv.RAY_ENV`'s
    defaults, Ray's token (:func:`optw.raylocal.ensure_token`) and the job's runtime
    environment (each worker pins its cluster's address), with a test's small resources;
    yields the ``ray`` module and shuts Ray down after. A Ray this process already runs is
    shut down first."""
    ray = pytest.importorskip("ray")
    from optw.distributed.rayenv import RUNTIME_ENV, configure_ray_env
    from optw.raylocal import ensure_token

    if ray.is_initialized():
        ray.shutdown()  # one instance at a time
    configure_ray_env()
    ensure_token(say=None)
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=dashboard,
             configure_logging=False, object_store_memory=object_store_mb * 1024**2,
             runtime_env=RUNTIME_ENV)
    try:
        yield ray
    finally:
        ray.shutdown()
