"""The first run says why it is slow (fak/runtime/boot.py cold_kernels): a module with cached kernels and no
index as new as its source is a compile to come; a terminal boot prints the reason before it starts."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fak.runtime import boot as boot_mod


def _module(root: Path, name: str, cached: bool = True) -> Path:
    src = root / f"{name}.py"
    src.write_text("from numba import njit\n@njit(cache=True)\ndef f(x):\n    return x\n" if cached else "x = 1\n")
    return src


def test_nothing_cached_is_cold_a_fresh_index_is_not_a_stale_one_is(tmp_path: Path) -> None:
    _module(tmp_path, "plain", cached=False)  # no cached kernels: never a reason
    src = _module(tmp_path, "kern")
    _module(tmp_path, "helpers")  # inline helpers: never cached on their own, not a sign either way
    assert boot_mod.cold_kernels(tmp_path) == tmp_path / "__pycache__"  # the first run
    idx = tmp_path / "__pycache__" / "kern.f-2.py311.nbi"
    idx.parent.mkdir()
    idx.write_bytes(b"")
    assert boot_mod.cold_kernels(tmp_path) is None
    later = time.time() + 10  # the source edited after the index: compiled again on the next run
    os.utime(src, (later, later))
    assert boot_mod.cold_kernels(tmp_path) == tmp_path / "__pycache__"


def test_a_boot_on_a_terminal_says_it_is_compiling(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    monkeypatch.setattr(boot_mod, "cold_kernels", lambda root=None: tmp_path / "__pycache__")
    b = boot_mod.boot("synthetic", show=True, scheduler=False)
    err = capsys.readouterr().err
    assert err.splitlines()[0] == (f"fak: compiling the kernels for this CPU (first run only, about half a minute; "
                                   f"cached in {tmp_path})")
    b.close()
    monkeypatch.setattr(boot_mod, "cold_kernels", lambda root=None: None)
    boot_mod.boot("synthetic", show=True, scheduler=False).close()
    assert "compiling" not in capsys.readouterr().err
    monkeypatch.setattr(boot_mod, "cold_kernels", lambda root=None: tmp_path)
    boot_mod.boot("synthetic", show=False, scheduler=False).close()  # piped / --json: quiet
    assert capsys.readouterr().err == ""


def test_this_checkout_is_warm_after_the_suite_compiled_it() -> None:
    """The engine's kernels are cached by the time this runs (earlier tests ran them): nothing cold."""
    from engine.model.session import warmup

    warmup()
    assert boot_mod.cold_kernels() is None


def test_compile_rows_count_each_outermost_compile_once_by_module() -> None:
    """A cold boot's rows (fak/runtime/compile_progress.py): a kernel compiled inside another is the outer
    one's work; rows are by module; after the block, compiles are no longer counted."""
    import io

    from numba import njit
    from rich.console import Console

    from fak.runtime.compile_progress import CompileProgress

    @njit
    def inner(x):  # type: ignore[no-untyped-def]
        return x + 1

    @njit
    def outer(x):  # type: ignore[no-untyped-def]
        return inner(x) * 2

    @njit
    def after(x):  # type: ignore[no-untyped-def]
        return x - 1

    out = io.StringIO()
    with CompileProgress(Console(file=out, width=100)) as cp:
        cp.start()
        assert outer(1) == 4
        assert outer(2.5) == 7.0  # a second signature: a second compile of the same kernel
    assert after(1) == 0
    assert list(cp.groups) == ["test_first_run"]
    g = cp.groups["test_first_run"]
    assert (g.done, g.active, g.last) == (2, 0, "test_compile_rows_count_each_outermost_compile_once_by_module.<locals>.outer")
    assert cp.compiled == 2
    assert "test_first_run" in out.getvalue() and "2 kernels compiled" in out.getvalue()


def test_a_helper_process_compile_is_a_row_of_its_own() -> None:
    """engine/model/compile_ahead.py's span (start, then end) is one kernel of its group's row."""
    import io

    from numba.core import event
    from rich.console import Console

    from engine.model.compile_ahead import KIND
    from fak.runtime.compile_progress import CompileProgress

    out = io.StringIO()
    with CompileProgress(Console(file=out, width=100)) as cp:
        cp.start()
        event.start_event(KIND, data={"group": "lane_kernel", "kernel": "lane_layers (a second process)"})
        assert cp.groups["lane_kernel"].active == 1
        event.end_event(KIND, data={"group": "lane_kernel", "kernel": "lane_layers"})
    g = cp.groups["lane_kernel"]
    assert (g.done, g.active) == (1, 0) and g.last == "lane_layers (a second process)"
    assert "lane_kernel" in out.getvalue() and "1 kernel compiled" in out.getvalue()
