"""The HTTP gateway `fak serve` (and later `fak guard`) runs: an ASGI app over one booted engine.

Exports: create_app (FastAPI app: OpenAI chat/completions, models, tokenize, health, metrics).
"""

from fak.gateway.app import create_app
from fak.gateway.config import ServeConfig

__all__ = ["ServeConfig", "create_app"]
