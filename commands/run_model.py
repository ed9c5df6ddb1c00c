"""`fak run MODEL [PROMPT]`: one-shot generation streamed to stdout (stats on stderr), a REPL without
PROMPT, or one JSON object with --json. MODEL is a GGUF path, an alias (gemma3-270m), or `synthetic`.

Generation is one request on the scheduler every other subcommand serves through (fak.runtime.boot), so
sampling, stop handling and text streaming exist once. The prompt is wrapped in the model's chat
template only when its GGUF carries one (or with --chat); a base model gets BOS + text, as
llama.cpp's completion tools do.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from engine.errors import EngineError


def _parse_ids(ids: str) -> list[int]:
    out = []
    for part in ids.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(int(part))
        except ValueError:
            raise EngineError(f"--ids: {part!r} is not an integer token id") from None
    if not out:
        raise EngineError("--ids: no token ids given")
    return out


def _check_text(what: str, text: str) -> None:
    """Text from argv or stdin that was not UTF-8 (Python keeps such bytes as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start].encode("utf-8", "surrogateescape")
        raise EngineError(f"{what}: not valid UTF-8 (byte {bad!r} at character {exc.start})") from None


def _prompt_ids(codec: Any, model_name: str, prompt: str, system: str | None, chat: bool) -> list[int]:
    _check_text("prompt", prompt)
    if system is not None:
        _check_text("--system", system)
    if codec is None:
        raise EngineError(f"{model_name}: no tokenizer installed to encode the prompt; pass --ids 1,2,3")
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return list(codec.encode_chat(messages))
    text = f"{system}\n\n{prompt}" if system else prompt
    return list(codec.encode(text))


def use_chat(codec: Any, chat: bool, raw: bool) -> bool:
    """--chat forces the template, --raw turns it off; otherwise only a GGUF that carries one gets it."""
    if chat and raw:
        raise EngineError("--chat and --raw contradict each other")
    if raw or codec is None:
        return False
    return chat or bool(getattr(codec, "has_chat_template", False))


def _generate(b: Any, ids: list[int], max_tokens: int, params: Any, as_json: bool) -> None:
    from engine.sched.lane import Request

    out_ids: list[int] = []
    result = None
    if max_tokens > 0:
        h = b.scheduler.admit(Request(ids, max_new_tokens=max_tokens, sampling=params))
        try:
            if as_json:
                out_ids = list(h.tokens())
            elif b.text_ok:
                for piece in h.pieces():
                    sys.stdout.write(piece)
                    sys.stdout.flush()
            else:  # no tokenizer for these ids: print the ids
                for tok in h.tokens():
                    sys.stdout.write(f" {tok}")
                    sys.stdout.flush()
        except KeyboardInterrupt:  # stop this generation (the REPL goes on)
            h.cancel()
            h.result()
            sys.stdout.write("\n")
            raise
        result = h.result()
        out_ids = list(result.token_ids)
    prefill, decode = _rates(result)
    if as_json:
        text = b.tokenizer.decode(out_ids, skip_special=True) if b.tokenizer is not None else ""
        print(json.dumps({"model": b.name, "prompt_ids": ids, "generated_ids": out_ids, "text": text,
                          "prefill_tok_s": round(prefill, 3), "decode_tok_s": round(decode, 3)}))
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    if result is not None and result.error:
        raise EngineError(result.error)
    reason = result.finish_reason.value if result is not None else "length"
    print(f"prompt: {len(ids)} tokens, {prefill:.1f} tok/s | "
          f"decode: {len(out_ids)} tokens, {decode:.1f} tok/s ({reason})", file=sys.stderr)


def _rates(r: Any) -> tuple[float, float]:
    """Prefill tok/s (admission to first token) and decode tok/s (first token to the last)."""
    if r is None or r.ttft_s is None:
        return 0.0, 0.0
    prefill = r.prompt_tokens / r.ttft_s if r.ttft_s > 0 else 0.0
    steps, span = len(r.token_ids) - 1, r.latency_s - r.ttft_s
    if r.finish_reason.value in ("eos", "stop"):
        steps += 1  # the terminating token was decoded too
    return prefill, (steps / span if steps > 0 and span > 0 else 0.0)


def run_model(
    model: str | None,
    prompt: str | None,
    *,
    max_tokens: int = 128,
    temp: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    system: str | None = None,
    ids: str | None = None,
    chat: bool = False,
    raw: bool = False,
    resident: bool = True,
    sched: Any = None,
    as_json: bool = False,
) -> None:
    from engine.model.sampling import SamplingParams
    from fak.runtime.boot import boot

    if max_tokens < 0:
        raise EngineError(f"--max-tokens must be >= 0, got {max_tokens}")
    if chat and raw:
        raise EngineError("--chat and --raw contradict each other")
    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, seed=seed)
    prompt_ids = _parse_ids(ids) if ids is not None else None
    b = boot(model, resident=resident, sched=sched, show=None if not as_json else False)
    try:
        vocab = b.model.config.vocab_size
        bad = [i for i in prompt_ids or () if not 0 <= i < vocab]
        if bad:
            raise EngineError(f"--ids: token id {bad[0]} out of range for vocab {vocab}")
        if prompt_ids is None and b.tokenizer is None:
            raise EngineError(f"{b.name}: no tokenizer installed to encode the prompt; pass --ids 1,2,3")
        templated = use_chat(b.tokenizer, chat, raw)
        if prompt_ids is not None:
            _generate(b, prompt_ids, max_tokens, params, as_json)
        elif prompt is not None:
            _generate(b, _prompt_ids(b.tokenizer, b.name, prompt, system, templated), max_tokens, params, as_json)
        else:
            _repl(b, system, templated, max_tokens, params, as_json)
    finally:
        b.close()


def _repl(b: Any, system: str | None, templated: bool, max_tokens: int, params: Any, as_json: bool) -> None:
    """Each line is a fresh one-shot prompt; Ctrl-C stops the generation in flight, Ctrl-D (EOF) ends."""
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            print(file=sys.stderr)
            return
        except KeyboardInterrupt:
            print(file=sys.stderr)
            continue
        if line.strip():
            try:
                _generate(b, _prompt_ids(b.tokenizer, b.name, line, system, templated), max_tokens, params, as_json)
            except KeyboardInterrupt:
                continue
