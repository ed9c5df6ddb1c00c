"""Continuous batching: requests and lanes, the scheduler loop, planning, output, preemption, prefix cache,
stats. Exports: NativeScheduler, Request, Handle, FinishReason, SchedStats."""

from engine.sched.lane import FinishReason, Handle, LaneResult, Request
from engine.sched.scheduler import NativeScheduler
from engine.sched.stats import SchedStats

__all__ = ["FinishReason", "Handle", "LaneResult", "NativeScheduler", "Request", "SchedStats"]
