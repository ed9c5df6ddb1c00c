"""POST /v1/embeddings: the last hidden state (after the output norm), mean-pooled over the input's
tokens and L2-normalised (engine.model.forward.Model.embed), one vector per input.

That is exactly what it is: a decoder LM's pooled state, not a trained embedding model; similar texts
do land closer than unrelated ones, but rankings are the model's, not a retrieval model's. The forward
runs on the scheduler's loop thread between two iterations (NativeScheduler.call), so running
streams pause for its duration instead of competing for the cores.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
from fastapi import APIRouter, Request

from fak.gateway.errors import APIError
from fak.gateway.generation import check_model, context_len, served
from fak.gateway.wires.protocol import EmbeddingRequest

router = APIRouter()
MAX_INPUTS = 256  # per request (OpenAI allows 2048; each input here is a full forward on 2 cores)


def _inputs(request: Request, b: Any, given: Any) -> list[list[int]]:
    """The request's inputs as token-id lists, each checked (empty, vocabulary, context)."""
    if isinstance(given, str) or (given and isinstance(given[0], int)):
        given = [given]
    if not given:
        raise APIError(400, "input: empty list", param="input")
    if len(given) > MAX_INPUTS:
        raise APIError(400, f"input: {len(given)} inputs; at most {MAX_INPUTS} per request", param="input")
    vocab, ctx = int(b.model.config.vocab_size), context_len(request, b)
    out = []
    for i, item in enumerate(given):
        ids = b.tokenizer.encode(item) if isinstance(item, str) else list(item)
        if not ids:
            raise APIError(400, f"input[{i}]: encodes to no tokens", param="input")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"input[{i}]: token id {bad[0]} outside the vocabulary (0..{vocab - 1})",
                           param="input")
        if len(ids) > ctx:
            raise APIError(400, f"input[{i}]: {len(ids)} tokens; this model's context length is {ctx}",
                           param="input", code="context_length_exceeded")
        out.append(ids)
    return out


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
    b = served(request)
    name = check_model(request, body.model)
    hidden = int(b.model.config.hidden)
    if body.dimensions is not None and body.dimensions != hidden:
        raise APIError(400, f"dimensions: this model's embeddings have {hidden}; truncation is not supported",
                       param="dimensions", code="unsupported_parameter")
    inputs = _inputs(request, b, body.input)
    model = b.model
    vectors = await asyncio.wrap_future(b.scheduler.call(lambda: [model.embed(ids) for ids in inputs]))
    data = []
    for i, v in enumerate(vectors):
        emb: Any = (base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode() if body.encoding_format == "base64"
                    else [float(x) for x in v])
        data.append({"object": "embedding", "index": i, "embedding": emb})
    n = sum(len(ids) for ids in inputs)
    return {"object": "list", "data": data, "model": name, "usage": {"prompt_tokens": n, "total_tokens": n}}
