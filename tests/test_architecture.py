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
    "errors": -1,  # optw/errors.py: the project's error types (OptwError: meant for the user)
    "checks": 0,  # optw/checks.py: the checking helpers of every settings table
    "outdir": 0,  # optw/outdir.py: output folders written whole, never over other files
    "raylocal": 1,  # Ray's token, its files, the workers' setup hook (uses raylogs)
    "raylogs": 0,  # the one filter of Ray's lines (jobs, Ray Train workers, serve)
    "threads": 0,  # optw/threads.py: torch threads from the cores actually free
    "allocator": 0,  # optw/allocator.py: glibc's mmap threshold for the decoder's tables
    "catalog": 1,
    "env": 2,
    "model": 3,
    "decode": 4,
    "train": 5,
    "baselines": 4,  # ILS: below train, which learns from its routes
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


def _module(path: Path, package: Path) -> str:
    rel = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def import_graph(package: Path | None = None) -> dict[str, set[str]]:
    """Module -> the optw modules it imports (module level and inside functions alike;
    ``from optw.pkg import sub`` counts as importing ``optw.pkg.sub`` when that is a module,
    else ``optw.pkg`` itself)."""
    root = package or PACKAGE
    files = sorted(root.rglob("*.py"))
    known = {_module(p, root) for p in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        src = _module(path, root)
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.split(".")[0] == "optw"}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module \
                    and node.module.split(".")[0] == "optw":
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    deps.add(sub if sub in known else node.module)
        graph[src] = {d for d in deps if d in known and d != src}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(out)


def _without_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph without edges into a package's ``__init__`` from its own modules: a
    package's ``__init__`` re-exports its modules, and a module that names its own package
    (``from optw.catalog import X`` inside ``optw.catalog``) reads a name defined below it."""
    return {src: {d for d in deps if not src.startswith(f"{d}.")} for src, deps in graph.items()}


#: Cycles being fixed on other branches (the orchestrator removes them at merge).
KNOWN_CYCLES: list[list[str]] = []  # none: every cycle is an error


def test_no_import_cycles():
    """No two modules of optw import each other, directly or through others (module-level
    and lazy imports alike): each concept has one home, and a lazy import is not a licence
    for a cycle (storage.py <-> ray_train.py was one)."""
    found = [c for c in cycles(_without_packages(import_graph())) if c not in KNOWN_CYCLES]
    assert found == []


def test_the_cycle_check_catches_a_lazy_cycle(tmp_path):
    """The checker itself: a lazy import closing a loop of three modules is reported."""
    pkg = tmp_path / "optw"
    (pkg / "distributed").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "distributed" / "__init__.py").write_text("")
    (pkg / "distributed" / "a.py").write_text("from optw.distributed import b\n")
    (pkg / "distributed" / "b.py").write_text("from optw.distributed.c import f\n")
    (pkg / "distributed" / "c.py").write_text("def f():\n    import optw.distributed.a\n")
    assert cycles(_without_packages(import_graph(pkg))) == [
        ["optw.distributed.a", "optw.distributed.b", "optw.distributed.c"]]
