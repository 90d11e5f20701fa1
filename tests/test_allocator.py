"""optw.allocator: the decoder raises glibc's mmap threshold once per process, and leaves the
allocator alone where the user asked (each case in a fresh process: the setting is
process-wide)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import optw.allocator as a
from optw.catalog import open_catalog
from optw.decode.core import Decoder
from optw.env import make_instances
from optw.model import ModelConfig, PointerNet
cat = open_catalog({catalog!r})
print(a._applied, end=" ")
Decoder(PointerNet(ModelConfig()), make_instances(cat.region("pr99"), cat.benchmark("pr99")))
print(a._applied, a.reuse_large_blocks())
"""


def _probe(tiny_catalog, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OPTW_MALLOC", "MALLOC_MMAP_THRESHOLD_")}
    out = subprocess.run([sys.executable, "-c", PROBE.format(catalog=str(tiny_catalog.path))],
                         env={**clean, "PYTHONPATH": str(ROOT / "platform"), **env},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_decoder_sets_the_threshold_once_unless_the_user_set_one(tiny_catalog):
    """Nothing is set on import; the first Decoder sets the threshold (and says so); the user's
    own ``MALLOC_MMAP_THRESHOLD_`` or ``OPTW_MALLOC=0`` leaves glibc's default."""
    assert _probe(tiny_catalog) == "None True True"
    assert _probe(tiny_catalog, OPTW_MALLOC="0") == "None False False"
    assert _probe(tiny_catalog, MALLOC_MMAP_THRESHOLD_="65536") == "None False False"
