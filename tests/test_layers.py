"""The package layers: no import cycles between the product's packages, and the lower packages never
import the upper ones.

    swarmbench  ->  swarm  ->  agents  ->  skills  ->  trainer  ->  harness, kernels, sandboxes, memory

`swarmbench/` (the benchmark suite) may import everything and nothing imports it (`swarm bench`
finds it through an entry point); `swarm/` (controller, decisions, workspace, CLI) may import the
rest; `agents/` reads evidence and returns proposals and never imports `swarm/`; `skills/`,
`trainer/`, `harness/`, `kernels/`, `sandboxes/` and `memory/` import neither `swarm/` nor
`agents/`. Every import counts, the ones inside functions and under `TYPE_CHECKING` too: a deferred
import still ties the packages together. The graph is read from the source with `ast` (nothing is
imported), so a violation is reported even when the module would fail to import.
docs/architecture.md says why each layer sits where it does.

    .venv/bin/python -m pytest tests/test_layers.py -q
"""
from __future__ import annotations

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("swarmbench", "swarm", "agents", "skills", "harness", "trainer", "kernels", "sandboxes", "memory")
# package -> the packages it must never import
FORBIDDEN = {
    "swarm": {"swarmbench"},
    "agents": {"swarmbench", "swarm"},
    "skills": {"swarmbench", "swarm", "agents"},
    "trainer": {"swarmbench", "swarm", "agents"},
    "harness": {"swarmbench", "swarm", "agents"},
    "kernels": {"swarmbench", "swarm", "agents"},
    "sandboxes": {"swarmbench", "swarm", "agents"},
    "memory": {"swarmbench", "swarm", "agents"},
}

Edge = tuple[str, str, str, int]   # (importing module, imported name, file, line)


def module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(root: pathlib.Path, path: pathlib.Path) -> list[tuple[str, int]]:
    """Absolute module names `path` imports (relative imports resolved), with their line."""
    mod = module_name(root, path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((name, node.lineno))
    return out


def package_edges(root: pathlib.Path, packages: tuple[str, ...]) -> list[Edge]:
    """Every import from one of `packages` into another of them."""
    edges = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            for name, line in imported_names(root, path):
                top = name.split(".")[0]
                if top in packages and top != pkg:
                    edges.append((module_name(root, path), name, str(path.relative_to(root)), line))
    return edges


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The package-level cycles: each strongly connected component of two or more packages
    (Tarjan), as a sorted list of package names."""
    graph: dict[str, set[str]] = {}
    for src, dst, _, _ in edges:
        graph.setdefault(src.split(".")[0], set()).add(dst.split(".")[0])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def violations(edges: list[Edge], forbidden: dict[str, set[str]]) -> list[str]:
    return [f"{file}:{line}: {src} imports {dst}" for src, dst, file, line in edges
            if dst.split(".")[0] in forbidden.get(src.split(".")[0], set())]


def where(edges: list[Edge], comp: list[str]) -> list[str]:
    return [f"{file}:{line}: {src} imports {dst}" for src, dst, file, line in edges
            if src.split(".")[0] in comp and dst.split(".")[0] in comp]


@functools.lru_cache(maxsize=1)
def project_edges() -> list[Edge]:
    return package_edges(ROOT, PACKAGES)


def test_no_package_import_cycles():
    edges = project_edges()
    found = cycles(edges)
    assert not found, "package import cycles:\n" + "\n".join(
        f"{' <-> '.join(c)}:\n  " + "\n  ".join(where(edges, c)) for c in found)


def test_lower_packages_never_import_upper_ones():
    bad = violations(project_edges(), FORBIDDEN)
    assert not bad, "layer violations (see docs/architecture.md):\n" + "\n".join(bad)


def test_every_package_is_checked():
    """A new top-level package with Python code must be placed in the layers here."""
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert on_disk - {"tests", "benchmarks"} <= set(PACKAGES), sorted(on_disk - set(PACKAGES))


def _tree(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_the_checks_see_cycles_and_violations(tmp_path):
    """The checks fail on what they look for: a cycle through a function-local import, a relative
    import resolved to its package, a forbidden upward import."""
    root = _tree(tmp_path, {
        "up/__init__.py": "",
        "up/a.py": "from low.b import x\n",
        "low/__init__.py": "",
        "low/b.py": "x = 1\ndef f():\n    import up.a\n",
        "low/c.py": "from . import b\nfrom .b import x\n",
        "leaf/__init__.py": "",
        "leaf/d.py": "import low.b\n",
    })
    edges = package_edges(root, ("up", "low", "leaf"))
    assert cycles(edges) == [["low", "up"]]
    assert violations(edges, {"low": {"up"}, "leaf": {"up"}}) == ["low/b.py:3: low.b imports up.a"]
    assert ("low.c", "low.b", "low/c.py", 2) not in edges       # within a package: not an edge
    assert imported_names(root, root / "low/c.py") == [("low", 1), ("low.b", 2)]


@pytest.mark.parametrize("pkg", PACKAGES)
def test_package_sources_parse(pkg):
    """Each package has sources the checks read (a renamed folder would make them vacuous)."""
    files = list((ROOT / pkg).rglob("*.py"))
    assert files, f"{pkg}/ has no Python files"
    for path in files:
        imported_names(ROOT, path)


def test_one_home_for_dotted_config_paths():
    """`recipe.lr`-style paths are read and written by the helpers at the end of trainer/config.py
    only; a second walker elsewhere drifts from them (missing sections, None, errors)."""
    home = ROOT / "trainer" / "config.py"
    others = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path == home:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "dotted" in node.name.lower():
                    others.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}")
    assert not others, "dotted-path helpers outside trainer/config.py: " + ", ".join(others)


def test_no_installed_distribution_shares_a_package_name():
    """An installed distribution whose import name is one of the project's packages (transformers
    5.25 requires `kernels`, a hub client) is shadowed by ours, and whatever imports it gets ours:
    constraints.txt keeps such versions out."""
    import importlib.metadata as md

    ours = set(PACKAGES)
    clash = {}
    for dist in md.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("-", "_")
        if name in ours:
            clash[name] = dist.version
    assert not clash, f"installed distributions named like the project's packages: {clash}"
