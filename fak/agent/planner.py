"""Planners: what proposes the next tool calls. The scripted one replays a task's plan (deterministic,
for `--offline` and CI); the model one asks an OpenAI-compatible chat endpoint (model.py).

A planner sees only what the loop shows it (`observe`): in the fak arm a refused call or a withheld
result arrives as a `[fak] ...` note, so whatever the note replaced never enters its context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Protocol

from fak.agent.task import Step


@dataclass(frozen=True)
class Proposal:
    """One proposed call: arguments as the planner wrote them (JSON text, maybe malformed)."""

    id: str
    tool: str
    arguments: str


@dataclass
class Turn:
    calls: list[Proposal]
    text: str = ""  # the planner's own words (its final answer when no call is proposed)
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Planner(Protocol):
    name: str

    def next_turn(self) -> Turn: ...

    def observe(self, call: Proposal, shown: str, failed: bool) -> None: ...


@dataclass
class ScriptedPlanner:
    """A naive planner: proposes the task's plan one step per turn, skipping a step whose condition does
    not hold on what it has seen so far, and filling `args_from` arguments from its context (that is how
    it follows an instruction it read, injected or not)."""

    steps: tuple[Step, ...]
    instructions: str
    name: str = "scripted"
    _next: int = 0
    _context: list[str] = field(default_factory=list)
    _failed: dict[int, bool] = field(default_factory=dict)  # step index -> its result was an error/refusal
    _pending: dict[str, int] = field(default_factory=dict)  # proposal id -> step index

    def __post_init__(self) -> None:
        self._context.append(self.instructions)

    def next_turn(self) -> Turn:
        seen = "\n".join(self._context)
        while self._next < len(self.steps):
            i = self._next
            self._next += 1
            st = self.steps[i]
            if st.when_seen is not None and st.when_seen.search(seen) is None:
                continue
            if st.when_failed is not None and not self._failed.get(st.when_failed, False):
                continue
            args = dict(st.args)
            missing = False
            for key, rx in st.args_from.items():
                m = rx.search(seen)
                if m is None:
                    missing = True
                    break
                args[key] = m.group(1)
            if missing:
                continue
            pid = f"step{i}"
            self._pending[pid] = i
            return Turn([Proposal(pid, st.tool, json.dumps(args, ensure_ascii=False))])
        return Turn([], text="done")

    def observe(self, call: Proposal, shown: str, failed: bool) -> None:
        self._context.append(shown)
        i = self._pending.pop(call.id, None)
        if i is not None:
            self._failed[i] = failed
