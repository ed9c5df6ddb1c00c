"""Where the replies come from: fak serve's app on the in-kernel model, in this process (its prefix
cache is what makes turn N+1 prefill only what turn N did not have), or any OpenAI-compatible server.
Either way the chat is an OpenAI client; the model's tool calls reach it unjudged (the in-kernel
server's kernel lets every offered call through) because the chat's own kernel judges and runs them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from fak.errors import FakError


@dataclass
class Backend:
    url: str  # the server's root (no /v1)
    model: str
    context: int | None  # the model's context length, when the server says
    local: Any = None  # the InKernelServer, if the model is in this process

    def client(self) -> Any:
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="fak-local", max_retries=0)

    def close(self) -> None:
        if self.local is not None:
            self.local.stop()


def remote(base_url: str) -> Backend:
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        r = httpx.get(f"{root}/v1/models", timeout=10)
        r.raise_for_status()
        entry = r.json()["data"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise FakError(f"--base-url {base_url}: no OpenAI-compatible server answers /v1/models ({exc})") from None
    return Backend(root, str(entry.get("id")), entry.get("max_model_len") or entry.get("context_length"))


def inkernel(model: str, *, plain: bool = False) -> Backend:
    from fak.gateway.local import InKernelServer

    server = InKernelServer(model, plain=plain, who="fak chat")
    server.start()
    return Backend(server.url, server.model, int(server.booted.model.config.context_length), server)
