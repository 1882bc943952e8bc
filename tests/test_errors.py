"""One exception hierarchy: every exception class the project defines derives from
`sandboxes.errors.SwarmlabError` (and keeps the builtin base its callers catch).

The classes are found in the source with `ast` (any class whose base is an exception name), then
imported to check their bases, so a new error class that forgets the root fails here.

    .venv/bin/python -m pytest tests/test_errors.py -q
"""
from __future__ import annotations

import ast
import importlib
import pathlib

from sandboxes.errors import SwarmlabError

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("swarm", "agents", "skills", "harness", "trainer", "kernels", "sandboxes", "memory")
# signals that end a loop or a decision, never reported as errors
CONTROL_FLOW = {"trainer.loop.StopRun"}


def exception_classes() -> list[tuple[str, str]]:
    """(module, class name) of every public top-level class whose bases name an exception."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            mod = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                    continue
                names = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in node.bases]
                if any(n.endswith(("Error", "Exception", "Unavailable", "Corrupt", "Locked")) for n in names):
                    out.append((mod, node.name))
    return out


def test_every_project_exception_derives_from_the_root():
    found = exception_classes()
    assert len(found) >= 10, found      # the scan sees the project's errors
    outside = []
    for mod, name in found:
        cls = getattr(importlib.import_module(mod), name)
        if issubclass(cls, BaseException) and not issubclass(cls, SwarmlabError) \
                and f"{mod}.{name}" not in CONTROL_FLOW:
            outside.append(f"{mod}.{name}{tuple(b.__name__ for b in cls.__bases__)}")
    assert not outside, "exceptions outside SwarmlabError: " + ", ".join(outside)


def test_the_root_keeps_the_builtin_bases_callers_catch():
    from memory.store import MemoryStoreError
    from swarm.store import WorkspaceLocked
    from trainer.checkpoint import CheckpointError
    from trainer.config import ConfigError

    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, SwarmlabError)
    for cls in (CheckpointError, MemoryStoreError, WorkspaceLocked):
        assert issubclass(cls, RuntimeError) and issubclass(cls, SwarmlabError), cls
