"""Engine registry: engine id -> factory, the kernel's one way to an engine. Built-ins are lazy "module:attr"
entries (a plugin table, not imports), so importing the kernel never imports an engine (inkernel pulls the model)."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from fak.core.abi import EngineDriver
from fak.errors import FakError

EngineFactory = Callable[..., EngineDriver]

# id -> factory, or "module:attr" resolved on first use.
_REGISTRY: dict[str, EngineFactory | str] = {
    "mock": "fak.engines.mock:MockEngine",
    "http": "fak.engines.http:HttpEngine",
    "inkernel": "fak.engines.inkernel:InKernelEngine",
    "sandbox": "fak.tools.sandbox:SandboxTools",
}


def register_engine(engine_id: str, factory: EngineFactory | str) -> None:
    """Register (or replace) an engine: a callable `factory(**opts) -> EngineDriver` or "module:attr"."""
    if not engine_id or not isinstance(engine_id, str):
        raise FakError(f"engine id must be a non-empty string, got {engine_id!r}")
    _REGISTRY[engine_id] = factory


def known_engines() -> list[str]:
    return sorted(_REGISTRY)


def _resolve(engine_id: str) -> EngineFactory:
    try:
        entry = _REGISTRY[engine_id]
    except KeyError:
        raise FakError(f"unknown engine {engine_id!r} (known: {', '.join(known_engines())})") from None
    if isinstance(entry, str):
        mod_name, _, attr = entry.partition(":")
        try:
            factory = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as exc:
            raise FakError(f"engine {engine_id!r} is not available ({entry}: {exc})") from None
        _REGISTRY[engine_id] = factory
        return factory  # type: ignore[no-any-return]
    return entry


def get_engine(engine_id: str, **opts: Any) -> EngineDriver:
    """A new engine instance for `engine_id` built with `opts`; unknown id -> FakError naming the known ones."""
    factory = _resolve(engine_id)
    try:
        inspect.signature(factory).bind(**opts)  # check the options only: a TypeError inside is a bug, not bad input
    except TypeError as exc:
        raise FakError(f"engine {engine_id!r}: bad options {sorted(opts)}: {exc}") from None
    except ValueError:
        pass  # no introspectable signature (a builtin): let the call decide
    return factory(**opts)
