"""Shared fixtures: the project's built catalog and tiny synthetic regions.

Tiny regions are written by the tests themselves in the benchmark formats (synthetic data, no
benchmark content), so model and training tests run in seconds.
"""

from __future__ import annotations

import os
import subprocess
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
    """A private copy of a built catalog (Parquet files and manifest) at ``dst``."""
    import shutil

    dst.mkdir(parents=True)
    for name in (*FILES, "manifest.json"):
        shutil.copy(cat.path / name, dst / name)
    return dst
