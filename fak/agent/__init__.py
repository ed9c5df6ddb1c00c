"""The agent loop and its A/B report: a task (data) run twice in fresh sandboxes, once with every call
through the kernel and once with the tools run directly. Exports load_task, run_ab, Task, ArmReport."""

from fak.agent.loop import run_ab, run_arm
from fak.agent.report import ArmReport
from fak.agent.task import Task, load_task

__all__ = ["ArmReport", "Task", "load_task", "run_ab", "run_arm"]
