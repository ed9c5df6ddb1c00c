"""`fak run MODEL [PROMPT]`: one-shot generation streamed to stdout (stats on stderr), a REPL without
PROMPT, or one JSON object with --json. MODEL is a GGUF path, an alias (gemma3-270m), or `synthetic`."""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

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


def _prompt_ids(codec: Any, model_name: str, prompt: str, system: Optional[str], chat: bool) -> list[int]:
    _check_text("prompt", prompt)
    if system is not None:
        _check_text("--system", system)
    if codec is None:
        raise EngineError(f"{model_name}: no tokenizer installed to encode the prompt; pass --ids 1,2,3")
    if chat and callable(getattr(codec, "encode_chat", None)):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return list(codec.encode_chat(messages))
    text = f"{system}\n\n{prompt}" if system else prompt
    return list(codec.encode(text))


def _generate(model: Any, codec: Any, name: str, ids: list[int], max_tokens: int, params: Any, as_json: bool) -> None:
    from engine.generate import Generation

    stop = tuple(getattr(codec, "eos_ids", ()) or ()) if codec is not None else ()
    if not stop and model.config.eos_id is not None:
        stop = (model.config.eos_id,)
    gen = Generation(model, ids, max_tokens, params, stop)
    stream = codec.stream(skip_special=True) if codec is not None and not as_json else None
    out_ids: list[int] = []
    for tok in gen:
        out_ids.append(tok)
        if as_json:
            continue
        piece = stream.push(tok) if stream is not None else f" {tok}"
        sys.stdout.write(piece)
        sys.stdout.flush()
    st = gen.stats
    if as_json:
        text = codec.decode(out_ids, skip_special=True) if codec is not None else ""
        print(json.dumps({"model": name, "prompt_ids": ids, "generated_ids": out_ids, "text": text,
                          "prefill_tok_s": round(st.prefill_tok_s, 3), "decode_tok_s": round(st.decode_tok_s, 3)}))
        return
    if stream is not None:
        sys.stdout.write(stream.flush())
    sys.stdout.write("\n")
    sys.stdout.flush()
    print(f"prompt: {st.prompt_tokens} tokens, {st.prefill_tok_s:.1f} tok/s | "
          f"decode: {st.generated} tokens, {st.decode_tok_s:.1f} tok/s ({st.stop_reason})", file=sys.stderr)


def run_model(
    model: Optional[str],
    prompt: Optional[str],
    *,
    max_tokens: int = 128,
    temp: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: Optional[int] = None,
    system: Optional[str] = None,
    ids: Optional[str] = None,
    q4k: bool = False,
    as_json: bool = False,
) -> None:
    from engine import load_model
    from engine.aliases import default_model, resolve_model
    from engine.generate import codec_for
    from engine.sampling import SamplingParams

    if max_tokens < 0:
        raise EngineError(f"--max-tokens must be >= 0, got {max_tokens}")
    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, seed=seed)
    name = model if model is not None else default_model()
    prompt_ids = _parse_ids(ids) if ids is not None else None
    if name == "synthetic":
        m, path = load_model("synthetic"), None
    else:
        path = resolve_model(name)
        m = load_model(str(path), resident=q4k)
    bad = [i for i in prompt_ids or () if not 0 <= i < m.config.vocab_size]
    if bad:
        raise EngineError(f"--ids: token id {bad[0]} out of range for vocab {m.config.vocab_size}")
    try:
        codec = codec_for(m, path)
    except EngineError:
        if prompt_ids is None:
            raise  # text needs a tokenizer; with --ids the ids are printed instead
        codec = None
    from engine.session import warmup

    warmup()  # load the numba kernels now, so the tok/s figures measure the model, not the JIT cache
    chat = name != "synthetic"
    if prompt_ids is not None:
        _generate(m, codec, name, prompt_ids, max_tokens, params, as_json)
        return
    if prompt is not None:
        _generate(m, codec, name, _prompt_ids(codec, name, prompt, system, chat), max_tokens, params, as_json)
        return
    while True:  # REPL: each line is a fresh one-shot prompt
        try:
            line = input(">>> ")
        except EOFError:
            print(file=sys.stderr)
            return
        if line.strip():
            _generate(m, codec, name, _prompt_ids(codec, name, line, system, chat), max_tokens, params, as_json)
