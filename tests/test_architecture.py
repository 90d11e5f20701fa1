"""The package's layering: data flows catalog → env → model → decode → train → evaluate →
tracking, and nothing flows back. Parsed from the source, so a new import that breaks a rule
fails here (see docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "platform" / "optw"

#: Each layer may import only layers of a strictly lower rank (and itself). Layers of the
#: same rank never import each other.
RANK = {
    "paths": 0,
    "raylocal": 0,  # Ray's token for local clusters; where Ray keeps its files
    "threads": 0,  # optw/threads.py: torch threads from the cores actually free
    "catalog": 1,
    "env": 2,
    "model": 3,
    "decode": 4,
    "train": 5,
    "baselines": 5,
    "evaluate": 6,
    "tracking": 7,
    "report": 8,
    "distributed": 9,
    "serve": 9,
    "cli": 10,  # optw/cli.py, the console script: nothing imports it
}


def _layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE).parts
    return rel[0].removesuffix(".py") if len(rel) > 1 or rel[0] != "__init__.py" else "optw"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported optw module) for every absolute import of ``optw.*`` in ``path``,
    including imports inside functions (lazy imports count too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("optw.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                out.append((node.lineno, "optw.<relative>"))
            elif node.module == "optw":
                out += [(node.lineno, f"optw.{a.name}") for a in node.names]
            elif node.module and node.module.startswith("optw."):
                out.append((node.lineno, node.module))
    return out


def violations() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        src = _layer(path)
        if src == "optw":
            continue
        assert src in RANK, f"{path}: new top-level module {src!r}; give it a rank in RANK"
        for line, module in _imports(path):
            where = f"{path.relative_to(PACKAGE.parent)}:{line}"
            if module == "optw.<relative>":
                bad.append(f"{where}: relative import (use absolute optw.* imports)")
                continue
            dst = module.split(".")[1]
            if dst == src:
                continue
            if dst not in RANK:
                bad.append(f"{where}: imports unknown layer {module}")
            elif RANK[dst] >= RANK[src]:
                bad.append(f"{where}: {src} (rank {RANK[src]}) imports {module} "
                           f"(rank {RANK[dst]})")
    return bad


def test_layers_import_only_lower_layers():
    """No layer imports one above it or beside it (evaluate → distributed, train → tracking,
    anything → serve or optw.cli are all refused)."""
    assert violations() == []


def test_the_rule_catches_an_upward_import(tmp_path, monkeypatch):
    """The checker itself: a module of train importing tracking is reported."""
    pkg = tmp_path / "optw"
    (pkg / "train").mkdir(parents=True)
    (pkg / "tracking").mkdir()
    (pkg / "train" / "bad.py").write_text("def f():\n    from optw.tracking import x\n")
    (pkg / "tracking" / "ok.py").write_text("from optw.train import y\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", pkg)
    assert len(violations()) == 1 and "train (rank 5) imports optw.tracking" in violations()[0]
