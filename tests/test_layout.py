"""The layering of engine/ (and fak/ over it): imports point down only, and no module import cycle.

Every import statement counts, module-level or inside a function: a lazy upward import is still an
upward dependency. Package order (a package may import only those listed for it):
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# package -> the packages it may import (besides itself); "errors" is engine/errors.py, "engine" the
# root __init__ (the public API, the top: nothing inside engine/ imports it). wire carries bytes between
# processes; pd and pipeline are siblings over it, neither imports the other.
BELOW_WIRE = {"errors", "gguf", "quant", "kernels", "model", "tokenizer", "grammar", "sched"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "gguf": {"errors"},
    "quant": {"errors", "gguf"},
    "kernels": {"errors", "gguf", "quant"},
    "model": {"errors", "gguf", "quant", "kernels"},
    "tokenizer": {"errors", "gguf"},
    "grammar": {"errors", "gguf", "quant", "kernels", "tokenizer"},
    "sched": {"errors", "gguf", "quant", "kernels", "model", "tokenizer", "grammar"},
    "wire": BELOW_WIRE,
    "pd": BELOW_WIRE | {"wire"},
    "pipeline": BELOW_WIRE | {"wire"},
    "engine": BELOW_WIRE | {"wire", "pd", "pipeline"},
}
# fak/ in layers: sandbox (the OS sandbox: bubblewrap argv, relay, allow-list proxy; imports no fak/ layer, so
# both the tools' Bash and the guard can use it) < core (the kernel) < tools < runtime (the booted engine) <
# engines (inkernel is the booted model behind the kernel's ABI; the kernel reaches engines by id through
# core.registry, never by import) and gateway < the surfaces guard, chat, agent (siblings). "fak" is
# fak/__init__.py, "errors" fak/errors.py.
FAK_ALLOWED: dict[str, set[str]] = {
    "fak": set(),
    "errors": set(),
    "sandbox": {"errors"},
    "core": {"errors"},
    "tools": {"errors", "core", "sandbox"},
    "runtime": {"errors", "core"},
    "engines": {"errors", "core", "tools", "runtime", "sandbox"},
    "gateway": {"errors", "core", "tools", "runtime", "sandbox"},
    "guard": {"errors", "core", "tools", "runtime", "gateway", "sandbox"},
    "chat": {"errors", "core", "tools", "runtime", "gateway", "sandbox"},
    "agent": {"errors", "core", "tools", "runtime", "gateway", "sandbox"},
}
# what build tools, linters (ruff's default exclude) and .gitignore templates skip as output or environments
OUTPUT_NAMES = {"dist", "build", "_build", "buck-out", "out", "site-packages", "node_modules", "venv", ".venv",
                "__pypackages__", "target", "eggs", ".eggs"}
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
    return parts[1] if len(parts) > 1 else parts[0]


def violations(edges: dict[str, set[str]]) -> list[str]:
    """Upward imports between layers or between engine packages."""
    bad = []
    for src, dsts in edges.items():
        for dst in dsts:
            s_top, d_top = src.split(".")[0], dst.split(".")[0]
            if LAYER[d_top] > LAYER[s_top]:
                bad.append(f"{src} imports {dst}: {s_top}/ may not import {d_top}/")
            elif s_top == d_top and s_top in ("engine", "fak"):
                sp, dp = package(src), package(dst)
                rules = ALLOWED if s_top == "engine" else FAK_ALLOWED
                if sp != dp and dp not in rules[sp]:
                    bad.append(f"{src} imports {dst}: {s_top}/{sp} may not import {s_top}/{dp}")
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


def test_packages_import_downwards_only() -> None:
    edges = project_edges()
    assert {package(m) for m in edges if m.startswith("engine")} <= set(ALLOWED)
    assert {package(m) for m in edges if m.startswith("fak")} <= set(FAK_ALLOWED), "a fak/ package with no layer"
    assert violations(edges) == []


def test_no_import_cycle() -> None:
    assert cycles(project_edges()) == []


def test_the_checks_have_teeth() -> None:
    edges = project_edges()
    planted = {k: set(v) for k, v in edges.items()}
    planted["engine.gguf.reader"].add("engine.model.loader")  # an upward import
    planted["engine.model.kv"].add("fak.core.kernel")  # engine/ reaching into fak/
    bad = violations(planted)
    assert any("engine/gguf may not import engine/model" in b for b in bad)
    assert any("engine/ may not import fak/" in b for b in bad)
    assert any("engine.gguf.reader" in c and "engine.model.loader" in c
               for c in cycles(planted)), "loader -> reader -> loader is a cycle"


def test_every_package_says_what_it_is() -> None:
    for init in sorted([*(ROOT / "engine").rglob("__init__.py"), *(ROOT / "fak").rglob("__init__.py")]):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.splitlines()) >= 2, f"{init.relative_to(ROOT)}: two lines on what it is and exports"


def test_engine_is_packages_not_a_flat_folder() -> None:
    flat = sorted(p.name for p in (ROOT / "engine").glob("*.py") if p.name not in ("__init__.py", "errors.py"))
    assert flat == [], f"modules outside a package: {flat}"


def test_fak_is_layers_not_a_flat_folder() -> None:
    flat = sorted(p.name for p in (ROOT / "fak").glob("*.py") if p.name not in ("__init__.py", "errors.py"))
    assert flat == [], f"modules outside a layer: {flat}"


def test_no_folder_is_named_like_build_output() -> None:
    named = []
    for top in (*TOP, "tests", "bench", "examples"):
        for here, dirs, _ in os.walk(ROOT / top):
            if Path(here) == ROOT / "tests":
                dirs.remove("agents")  # an npm package: its node_modules/ is what that name is for
            named += [str((Path(here) / d).relative_to(ROOT)) for d in dirs if d in OUTPUT_NAMES]
    assert named == [], f"tools skip folders with these names: {named}"


def test_no_test_imports_another_test() -> None:
    """Shared helpers live in tests/support/; a test module importing another runs its tests' imports twice
    and ties two files' fixtures together."""
    tests = ROOT / "tests"
    names = {p.stem for p in tests.rglob("test_*.py")}
    bad = []
    for p in sorted(tests.rglob("*.py")):
        if "node_modules" in p.parts:
            continue
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{p.relative_to(ROOT)} imports {m}" for m in mods if m.split(".")[-1] in names]
    assert bad == []


def test_tests_mirror_the_code() -> None:
    """tests/engine/<pkg>/ and tests/fak/<pkg>/ name real packages; e2e/ and support/ are the only others."""
    tests = ROOT / "tests"
    for side in ("engine", "fak"):
        for d in sorted(p for p in (tests / side).iterdir() if p.is_dir() and p.name != "__pycache__"):
            assert (ROOT / side / d.name).is_dir(), f"tests/{side}/{d.name}: no {side}/{d.name} package"
    # artifacts/: what the browser tests save (screenshots), ignored by git; not code to mirror
    skip = ("__pycache__", ".pytest_cache", "artifacts")
    top = sorted(p.name for p in tests.iterdir() if p.is_dir() and p.name not in skip)
    assert top == ["agents", "e2e", "engine", "fak", "support"], top
    loose = sorted(p.name for p in tests.glob("*.py") if p.name not in ("conftest.py", "test_layout.py",
                                                                      "test_suite_setup.py"))
    assert loose == [], f"tests outside the mirror: {loose}"


def test_test_file_names_are_unique() -> None:
    """pytest imports test modules by basename (no __init__.py under tests/): two test_x.py in different
    folders stop the whole collection, so a mirrored test takes a name of its own."""
    seen: dict[str, Path] = {}
    dupes = []
    for p in sorted((ROOT / "tests").rglob("test_*.py")):
        if "node_modules" in p.parts:
            continue
        if p.name in seen:
            dupes.append(f"{seen[p.name].relative_to(ROOT)} and {p.relative_to(ROOT)}")
        seen.setdefault(p.name, p)
    assert not dupes, dupes
