"""What a cold first run is doing: a row per kernel group while numba compiles the kernels for this CPU.

numba reports every compile as an event (numba.core.event, "numba:compile"); a compile started inside
another (a kernel calling a kernel) belongs to the outer one, so only a thread's outermost compiles are
rows' work. A group is the kernel's module (tilegemm, lane_kernel, attention, ...). A kernel compiled by a
helper process (engine/model/compile_ahead.py) is a "fak:compile-ahead" event of its own, its row's span. The rows are drawn
with rich on stderr, on a terminal only (boot decides); the weights' own progress bar may be on screen
while the first compile runs (repacking tiles), and rich draws one live display at a time, so the rows
start after the load (`start()`), those compiled before it shown done.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from numba.core import event

from engine.model.compile_ahead import KIND as AHEAD


@dataclass
class Group:
    """One kernel group's compiles so far."""

    name: str
    done: int = 0
    seconds: float = 0.0
    active: int = 0  # outermost compiles of this group in flight
    last: str = ""  # the kernel compiling now (or last)
    ahead_t0: float = 0.0  # when a helper process started compiling this group's kernel
    task: Any = field(default=None, repr=False)


def group_of(dispatcher: Any) -> tuple[str, str]:
    """(group, kernel) of a numba dispatcher: the module's last name and the function's."""
    fn = getattr(dispatcher, "py_func", None)
    module = getattr(fn, "__module__", "") or "?"
    return module.rsplit(".", 1)[-1], getattr(fn, "__qualname__", "?")


class CompileProgress(event.Listener):
    """Listens to numba's compile events from `with CompileProgress(console) as cp:` on; `cp.start()`
    draws the rows (from then on, live), leaving the block marks every group done and stops drawing."""

    def __init__(self, console: Any = None) -> None:
        self.console = console
        self.groups: dict[str, Group] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._progress: Any = None
        self._t0 = time.perf_counter()

    def __enter__(self) -> CompileProgress:
        event.register("numba:compile", self)
        event.register(AHEAD, self)
        return self

    def __exit__(self, *exc: object) -> None:
        event.unregister("numba:compile", self)
        event.unregister(AHEAD, self)
        with self._lock:
            for g in self.groups.values():
                g.active = 0
                self._draw(g)
            if self._progress is not None:
                self._progress.stop()
                self._progress = None

    @property
    def compiled(self) -> int:
        return sum(g.done for g in self.groups.values())

    def start(self) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn

        with self._lock:
            if self._progress is not None:
                return
            # no elapsed column: a row made done (compiled before the rows were drawn) would keep counting
            self._progress = Progress(SpinnerColumn(finished_text="[green]✓"), TextColumn("{task.description}"),
                                      console=self.console, transient=False)
            self._progress.start()
            for g in self.groups.values():
                self._draw(g)

    def on_start(self, ev: Any) -> None:
        if ev.kind == AHEAD:
            self._ahead(ev, True)
            return
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth:
            return
        name, kernel = group_of(ev.data.get("dispatcher"))
        self._local.begun = (name, time.perf_counter())
        with self._lock:
            g = self.groups.setdefault(name, Group(name))
            g.active += 1
            g.last = kernel
            self._draw(g)

    def on_end(self, ev: Any) -> None:
        if ev.kind == AHEAD:
            self._ahead(ev, False)
            return
        self._local.depth = depth = getattr(self._local, "depth", 1) - 1
        if depth:
            return
        name, t = self._local.begun
        with self._lock:
            g = self.groups[name]
            g.active -= 1
            g.done += 1
            g.seconds += time.perf_counter() - t
            self._draw(g)

    def _ahead(self, ev: Any, start: bool) -> None:
        """A helper process's span: its group's row compiles from start to end (one kernel)."""
        name = ev.data["group"]
        with self._lock:
            g = self.groups.setdefault(name, Group(name))
            if start:
                g.active += 1
                g.last = ev.data["kernel"]
                g.ahead_t0 = time.perf_counter()
            elif g.active:
                g.active -= 1
                g.done += 1
                g.seconds += time.perf_counter() - g.ahead_t0
            self._draw(g)

    def _draw(self, g: Group) -> None:
        """The group's row (under the lock): a spinner while one of its kernels compiles, a tick after."""
        if self._progress is None:
            return
        what = f"compiling {g.last}" if g.active else f"{g.done} kernel{'s' * (g.done != 1)} compiled, {g.seconds:.0f} s"
        desc = f"{g.name:<14} {what}"
        if g.task is None:
            g.task = self._progress.add_task(desc, total=None if g.active else 1, completed=0 if g.active else 1)
        else:
            self._progress.update(g.task, description=desc, total=None if g.active else 1,
                                  completed=0 if g.active else 1)
