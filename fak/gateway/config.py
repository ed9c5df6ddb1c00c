"""ServeConfig: everything about how the gateway serves, as one typed record (what `fak serve`'s flags say, and
what `fak guard`, `fak chat` and `fak agent` set for their private servers). Handlers read `app.state.config`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServeConfig:
    model_name: str  # the name clients use (/v1/models)
    api_key: str | None = None  # required on every route but the public ones (Bearer or X-Api-Key)
    cors_origins: tuple[str, ...] = ()
    max_queue: int = 0  # waiting requests before 429 (0: unbounded)
    max_model_len: int = 0  # context a request may use (0: the model's)
    console: bool = False  # the web console at / and its JSON routes
    # for a private server in front of an agent (guard): its clients ask for their provider's names and limits
    any_model: bool = False  # answer whatever model name a request gives (Claude Code asks for claude-*)
    clamp_max_tokens: bool = False  # clamp max_tokens to the context instead of refusing it
    lenient_tools: bool = False  # drop tools only the provider runs (web_search) or freeform ones, not 400
    on_decision: Callable[[Any], None] | None = None  # every tool-call adjudication (guard tallies them)
