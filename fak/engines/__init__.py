"""What an allowed call is dispatched to: mock (echo), http (an OpenAI-compatible server), inkernel (the booted
model). The kernel finds them by id through fak.core.registry (re-exported here: get_engine, register_engine).
"""

from fak.core.registry import EngineFactory, get_engine, known_engines, register_engine

__all__ = ["EngineFactory", "get_engine", "known_engines", "register_engine"]
