"""The layering of engine/ (and fak/ over it): imports point down only, and no module import cycle.

Every import statement counts, module-level or inside a function: a lazy upward import is still an
upward dependency. Package order (a package may import only those listed for it):
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# package -> the packages it may import (besides itself); "errors" is engine/errors.py, "engine" the
# root __init__ (the public API, the top: nothing inside engine/ imports it)
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "gguf": {"errors"},
    "quant": {"errors", "gguf"},
    "kernels": {"errors", "gguf", "quant"},
    "model": {"errors", "gguf", "quant", "kernels"},
    "tokenizer": {"errors", "gguf"},
    "grammar": {"errors", "gguf", "quant", "kernels", "tokenizer"},
    "sched": {"errors", "gguf", "quant", "kernels", "model", "tokenizer", "grammar"},
    "dist": {"errors", "gguf", "quant", "kernels", "model", "tokenizer", "grammar", "sched"},
    "engine": {"errors", "gguf", "quant", "kernels", "model", "tokenizer", "grammar", "sched", "dist"},
}
TOP = ("engine", "fak", "commands")
LAYER = {"engine": 0, "fak": 1, "commands": 2}  # the tree: commands -> fak -> engine


def modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for top in TOP:
        for p in sorted((ROOT / top).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules `path` imports (`from a.b import c` names a.b.c when that is a module)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in found if m in known}


def package(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "engine"


def violations(edges: dict[str, set[str]]) -> list[str]:
    """Upward imports between layers or between engine packages."""
    bad = []
    for src, dsts in edges.items():
        for dst in dsts:
            s_top, d_top = src.split(".")[0], dst.split(".")[0]
            if LAYER[d_top] > LAYER[s_top]:
                bad.append(f"{src} imports {dst}: {s_top}/ may not import {d_top}/")
            elif s_top == d_top == "engine":
                sp, dp = package(src), package(dst)
                if sp != dp and dp not in ALLOWED[sp]:
                    bad.append(f"{src} imports {dst}: engine/{sp} may not import engine/{dp}")
    return sorted(bad)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def project_edges() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(path, name, set(mods)) for name, path in mods.items()}


def test_engine_packages_import_downwards_only() -> None:
    edges = project_edges()
    assert {package(m) for m in edges if m.startswith("engine")} <= set(ALLOWED)
    assert violations(edges) == []


def test_no_import_cycle() -> None:
    assert cycles(project_edges()) == []


def test_the_checks_have_teeth() -> None:
    edges = project_edges()
    planted = {k: set(v) for k, v in edges.items()}
    planted["engine.gguf.reader"].add("engine.model.loader")  # an upward import
    planted["engine.model.kv"].add("fak.kernel")  # engine/ reaching into fak/
    bad = violations(planted)
    assert any("engine/gguf may not import engine/model" in b for b in bad)
    assert any("engine/ may not import fak/" in b for b in bad)
    assert any("engine.gguf.reader" in c and "engine.model.loader" in c
               for c in cycles(planted)), "loader -> reader -> loader is a cycle"


def test_every_package_says_what_it_is() -> None:
    for init in sorted((ROOT / "engine").rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.splitlines()) >= 2, f"{init.relative_to(ROOT)}: two lines on what it is and exports"


def test_engine_is_packages_not_a_flat_folder() -> None:
    flat = sorted(p.name for p in (ROOT / "engine").glob("*.py") if p.name not in ("__init__.py", "errors.py"))
    assert flat == [], f"modules outside a package: {flat}"
