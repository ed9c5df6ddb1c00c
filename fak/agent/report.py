"""The A/B report: one ArmReport per arm, the differences between them, the rich side-by-side table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# The per-arm figures, in the order the table shows them (bools render yes/no).
FIGURES = ("turns", "tool_calls", "tool_errors", "denies", "transforms", "quarantines", "injection_reached_context",
           "destructive_executed", "secret_leaked", "task_completed", "prompt_tokens", "completion_tokens",
           "wall_time_s")
_BAD_IF_TRUE = {"injection_reached_context", "destructive_executed", "secret_leaked"}


@dataclass
class CallRecord:
    turn: int
    tool: str
    arguments: str  # as the planner wrote them
    outcome: str  # ok | error | DENY <reason> | QUARANTINE <reason> | RESULT_DENY <reason>
    shown: str  # what the planner saw (cut to a preview)


@dataclass
class ArmReport:
    arm: str  # "fak" | "baseline"
    task: str
    planner: str
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    denies: int = 0
    transforms: int = 0
    quarantines: int = 0
    injection_reached_context: bool = False
    destructive_executed: bool = False
    secret_leaked: bool = False
    task_completed: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_time_s: float = 0.0
    stopped: str = ""  # "done" (the planner finished) | "max_turns"
    damaged_canaries: list[str] = field(default_factory=list)
    final_text: str = ""
    sandbox: str = ""
    calls: list[CallRecord] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def differences(fak: ArmReport, base: ArmReport) -> dict[str, Any]:
    """Every figure on which the arms differ: {"fak": x, "baseline": y} (numbers add "delta": fak - baseline)."""
    out: dict[str, Any] = {}
    for f in FIGURES:
        a, b = getattr(fak, f), getattr(base, f)
        if a == b:
            continue
        d: dict[str, Any] = {"fak": a, "baseline": b}
        if not isinstance(a, bool):
            d["delta"] = round(a - b, 3) if isinstance(a, float) else a - b
        out[f] = d
    return out


def report_json(task: str, planner: str, policy: str, fak: ArmReport, base: ArmReport) -> dict[str, Any]:
    return {"task": task, "planner": planner, "policy": policy,
            "arms": {"fak": fak.to_json(), "baseline": base.to_json()}, "differences": differences(fak, base)}


def _cell(name: str, v: Any) -> str:
    if isinstance(v, bool):
        bad = v if name in _BAD_IF_TRUE else (not v if name == "task_completed" else False)
        return f"[{'bold red' if bad else 'green'}]{'yes' if v else 'no'}[/]"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def _delta(name: str, a: Any, b: Any) -> str:
    if a == b:
        return "[dim]=[/]"
    if isinstance(a, bool):
        return "[bold]differs[/]"
    d = a - b
    return f"{d:+.2f}" if isinstance(d, float) else f"{d:+d}"


def ab_table(fak: ArmReport, base: ArmReport, title: str) -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    t.add_column("")
    t.add_column("fak", justify="right")
    t.add_column("baseline", justify="right")
    t.add_column("Δ", justify="right")
    for f in FIGURES:
        a, b = getattr(fak, f), getattr(base, f)
        t.add_row(f.replace("_", " "), _cell(f, a), _cell(f, b), _delta(f, a, b))
    return t


def calls_table(rep: ArmReport, width: int = 60) -> Any:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"{rep.arm} arm: calls", title_justify="left", show_lines=False)
    for col in ("turn", "tool", "arguments", "outcome"):
        t.add_column(col, overflow="fold")
    for c in rep.calls:
        style = "red" if c.outcome.startswith(("DENY", "RESULT_DENY")) else "yellow" if c.outcome.startswith("QUARANTINE") \
            else "dim" if c.outcome == "error" else ""
        args = c.arguments if len(c.arguments) <= width else c.arguments[: width - 1] + "…"
        t.add_row(str(c.turn), c.tool, escape(args), f"[{style}]{escape(c.outcome)}[/]" if style else escape(c.outcome))
    return t
