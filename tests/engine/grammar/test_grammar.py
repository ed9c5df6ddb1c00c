"""Constrained decoding (engine/grammar): outputs match their grammar, the mask never changes anyone else.

On the synthetic model (byte vocabulary, random weights: left alone it writes bytes, never JSON) and on
Gemma 3 270M with its tokenizer (marked gemma). Every output test here fails when the mask is not
applied: the synthetic model's free output is not JSON, and Gemma's prose is not either.
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from engine import Session
from engine.errors import EngineError
from engine.grammar import GrammarSpec, compiler_for
from engine.grammar.compile import to_lark
from engine.kernels.bitmask import mask_logits, mask_logits_ref
from engine.model.sampling import SamplingParams
from engine.sched.lane import FinishReason, Request
from engine.sched.output import token_logprob
from engine.sched.scheduler import NativeScheduler
from engine.tokenizer.tokenizer import ByteTokenizer
from support.sched_helpers import model, rand_prompt, solo

COMPACT = (", ", ": ")  # the byte model loves blanks: fixed separators make its outputs end
SCHEMAS = {
    "person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
               "required": ["name", "age"], "additionalProperties": False},
    "flags": {"type": "object", "properties": {"ok": {"type": "boolean"},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                                        "maxItems": 3},
                                               "n": {"type": ["integer", "null"], "maximum": 9999}},
              "required": ["ok", "tags", "n"], "additionalProperties": False},
    "weather": {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
                                                 "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": False},
}
PREFIX = '<tool_call>\n{"name": "get_weather", "arguments": '
SUFFIX = "}\n</tool_call>"
CLOSE_SOON = SamplingParams(logit_bias={ord('"'): 8.0, ord("}"): 4.0})  # json_object: strings end, objects close


def prompts(n: int, seed: int = 3, length: int = 12) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rand_prompt(rng, length) for _ in range(n)]


def scheduler(**kw: object) -> NativeScheduler:
    kw = {"thread": False, "numba_threads": 1, **kw}
    return NativeScheduler(model(), tokenizer=ByteTokenizer(), **kw)  # type: ignore[arg-type]


def run(sched: NativeScheduler, reqs: list[Request]) -> list:  # type: ignore[type-arg]
    hs = [sched.admit(r) for r in reqs]
    while sched.step():
        pass
    return [h.result(0) for h in hs]


# -- the kernel and the spec ---------------------------------------------------------------------
@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 256, 1000])
@pytest.mark.parametrize("frac", [0.0, 0.01, 0.5, 1.0])
def test_mask_kernel_matches_numpy(vocab: int, frac: float) -> None:
    rng = np.random.default_rng(vocab)
    z = rng.standard_normal(vocab).astype(np.float32)
    bits = np.zeros(-(-vocab // 32) * 32, dtype=bool)
    bits[:vocab] = rng.random(vocab) < frac
    words = np.packbits(bits, bitorder="little").view(np.int32).copy()
    want = mask_logits_ref(z, words)
    got = z.copy()
    assert mask_logits(got, words) == int(bits.sum())
    assert np.array_equal(got, want)
    short = z.copy()  # a mask narrower than the row: the rest is not allowed
    mask_logits(short, words[:-1])
    assert np.all(np.isneginf(short[len(words[:-1]) * 32:]))


def test_spec_constructors_and_lark() -> None:
    s = GrammarSpec.sequence("a\n\"", GrammarSpec.json_schema({"type": "integer"}, COMPACT),
                             GrammarSpec.choice("x", GrammarSpec.regex("[0-9]/[0-9]")))
    assert s == GrammarSpec.sequence("a\n\"", GrammarSpec.json_schema('{"type": "integer"}', COMPACT),
                                     GrammarSpec.choice("x", GrammarSpec.regex("[0-9]/[0-9]")))
    assert hash(s) == hash(GrammarSpec.sequence(*s.parts))
    lark = to_lark(s)
    assert lark.splitlines()[0] == "start: g0"
    assert '"a\\n\\""' in lark and "%json" in lark and "/[0-9]\\/[0-9]/" in lark and '"x" | ' in lark
    for bad in (lambda: GrammarSpec.json_schema([1, 2]), lambda: GrammarSpec.json_schema("{nope"),
                lambda: GrammarSpec.json_schema({"a": {1, 2}}), lambda: GrammarSpec.regex(""),
                lambda: GrammarSpec.sequence(3), lambda: GrammarSpec.choice(),  # type: ignore[arg-type]
                lambda: GrammarSpec.json_object(separators=(";", ":")), lambda: GrammarSpec("cfg")):
        with pytest.raises(EngineError):
            bad()


@pytest.mark.parametrize("lit", ['é ü\\ "q" \t\x01 {}', "/x/", "☃\n", "%json"])
def test_literals_are_exact_whatever_they_hold(lit: str) -> None:
    m = compiler_for(ByteTokenizer(), 256, ()).matcher(GrammarSpec.sequence(lit, GrammarSpec.regex("[0-9]"), lit))
    text = lit.encode() + b"5" + lit.encode()
    for i, b in enumerate(text):
        z = np.zeros(256, np.float32)
        assert m.mask(z) == (10 if i == len(lit.encode()) else 1) and np.isfinite(z[b])  # the literal's next byte
        m.advance(b)
    assert m.done


def test_compiled_once_per_tokenizer_and_spec() -> None:
    tok = ByteTokenizer()
    c = compiler_for(tok, 256, ())
    assert compiler_for(tok, 256, ()) is c
    spec = GrammarSpec.json_schema(SCHEMAS["person"], COMPACT)
    first = c.compile(spec)
    assert c.compile(GrammarSpec.json_schema(dict(SCHEMAS["person"]), COMPACT)) is first  # equal spec: cached
    a, b = c.matcher(spec), c.matcher(spec)
    a.advance(ord("{"))  # matchers are independent copies
    z = np.zeros(256, np.float32)
    b.mask(z)
    assert np.isfinite(z[ord("{")]) and np.isinf(z[ord('"')])


# -- outputs on the synthetic model --------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_outputs_validate_against_their_schema(name: str) -> None:
    schema = SCHEMAS[name]
    res = run(scheduler(max_running=4), [Request(p, max_new_tokens=96, grammar=GrammarSpec.json_schema(schema, COMPACT))
                                         for p in prompts(4)])
    for r in res:
        assert r.finish_reason is FinishReason.STOP, r.text
        jsonschema.validate(json.loads(r.text), schema)
        assert r.text.encode("utf-8") == bytes(r.token_ids)


def test_json_object_gives_an_object() -> None:
    res = run(scheduler(max_running=6), [Request(p, max_new_tokens=160, sampling=CLOSE_SOON,
                                                 grammar=GrammarSpec.json_object(COMPACT)) for p in prompts(6, seed=5)])
    objs = [json.loads(r.text) for r in res if r.finish_reason is FinishReason.STOP]
    assert len(objs) == 6 and all(isinstance(o, dict) for o in objs)
    assert any(o for o in objs), "only empty objects: the test would not see keys"


def test_prefix_schema_suffix_is_exact() -> None:
    schema = SCHEMAS["weather"]
    spec = GrammarSpec.sequence(PREFIX, GrammarSpec.json_schema(schema, COMPACT), SUFFIX)
    for r in run(scheduler(max_running=3), [Request(p, max_new_tokens=128, grammar=spec) for p in prompts(3, seed=5)]):
        assert r.finish_reason is FinishReason.STOP
        assert r.text.startswith(PREFIX) and r.text.endswith(SUFFIX)
        jsonschema.validate(json.loads(r.text[len(PREFIX):-len(SUFFIX)]), schema)


def test_choice_and_regex() -> None:
    specs = [GrammarSpec.choice("yes", "no", "maybe"), GrammarSpec.regex(r"[0-9]{3}-[a-z]{2,4}")]
    res = run(scheduler(max_running=2), [Request(p, max_new_tokens=32, grammar=s) for p in prompts(2) for s in specs])
    import re

    for r, s in zip(res, specs * 2, strict=False):
        assert r.finish_reason is FinishReason.STOP
        assert (r.text in ("yes", "no", "maybe")) if s.kind == "choice" else re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", r.text)


def test_invalid_grammar_raises_at_admit() -> None:
    sched = scheduler()
    for spec in (GrammarSpec.json_schema({"type": "objekt"}),
                 GrammarSpec.json_schema({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}),
                 GrammarSpec.json_schema({"type": "string", "minLength": 5, "maxLength": 2}),
                 GrammarSpec.regex("[unclosed"),
                 GrammarSpec.sequence("x", GrammarSpec.json_schema({"type": 7}))):
        with pytest.raises(EngineError, match="invalid grammar"):
            sched.admit(Request([1, 2, 3], grammar=spec))
    with pytest.raises(EngineError, match="GrammarSpec"):
        sched.admit(Request([1, 2, 3], grammar={"type": "object"}))  # type: ignore[arg-type]
    assert not sched.step() and sched.stats().waiting == 0  # nothing was queued
    bare = NativeScheduler(model(), thread=False, numba_threads=1)
    with pytest.raises(EngineError, match="needs a tokenizer"):
        bare.admit(Request([1, 2, 3], grammar=GrammarSpec.json_object()))


def test_length_before_complete() -> None:
    (r,) = run(scheduler(), [Request(prompts(1)[0], max_new_tokens=5,
                                     grammar=GrammarSpec.json_schema(SCHEMAS["weather"], COMPACT))])
    assert r.finish_reason is FinishReason.LENGTH and r.text == '{"cit'


def _mixed(n_free: int = 3) -> tuple[list[Request], list[Request]]:
    ps = prompts(6, seed=9)
    constrained = [Request(ps[i], max_new_tokens=64, grammar=GrammarSpec.json_schema(SCHEMAS[k], COMPACT))
                   for i, k in enumerate(sorted(SCHEMAS))]
    free = [Request(p, max_new_tokens=24) for p in ps[3:3 + n_free]]
    return constrained, free


def test_batched_lanes_equal_their_solo_runs_and_free_lanes_are_untouched() -> None:
    constrained, free = _mixed()
    alone = [run(scheduler(max_running=1), [r])[0] for r in constrained]
    batch = constrained[:1] + free[:1] + constrained[1:] + free[1:]  # interleaved in admission order
    together = run(scheduler(max_running=6), batch)
    got = {id(r): res for r, res in zip(batch, together, strict=False)}
    for r, a in zip(constrained, alone, strict=False):
        assert got[id(r)].token_ids == a.token_ids and got[id(r)].finish_reason is FinishReason.STOP
        jsonschema.validate(json.loads(got[id(r)].text), r.grammar.schema)  # type: ignore[union-attr]
    for r in free:  # unconstrained: exactly the plain Session's greedy tokens, batch mates or not
        assert got[id(r)].token_ids == solo(list(r.prompt), 24, 64)  # type: ignore[arg-type]


def test_constrained_sampling_stays_in_the_grammar_and_is_seeded() -> None:
    schema = SCHEMAS["flags"]
    reqs = [Request(p, max_new_tokens=96, grammar=GrammarSpec.json_schema(schema, COMPACT),
                    sampling=SamplingParams(temperature=1.0, top_p=0.95, seed=i)) for i, p in enumerate(prompts(4))]
    a, b = run(scheduler(max_running=4), reqs), run(scheduler(max_running=4), reqs)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    for r in a:
        assert r.finish_reason is FinishReason.STOP
        jsonschema.validate(json.loads(r.text), schema)


def test_logprobs_are_of_the_raw_logits() -> None:
    p = prompts(1, seed=4)[0]
    (r,) = run(scheduler(), [Request(p, max_new_tokens=40, logprobs=3,
                                     grammar=GrammarSpec.json_schema(SCHEMAS["person"], COMPACT))])
    assert r.finish_reason is FinishReason.STOP and len(r.logprobs) == len(r.token_ids)
    s = Session(model())
    logits = s.prefill(p)
    outside = 0
    for t, lp in zip(r.token_ids, r.logprobs, strict=False):
        assert lp == token_logprob(logits, t, 3)  # the unmasked distribution, bit for bit
        outside += lp.top[0][0] != t  # the raw favourite was not allowed: the mask decided
        logits = s.step(t)
    s.free()
    assert outside > 0


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preempted_constrained_lanes_keep_their_output(mode: str) -> None:
    constrained, free = _mixed()
    want = [run(scheduler(max_running=1), [r])[0].token_ids for r in constrained + free]
    sched = scheduler(max_running=6, kv_blocks=16, block_tokens=4, preempt=mode, prefill_chunk=16)
    res = run(sched, constrained + free)
    assert sum(r.preemptions for r in res) >= 2
    assert [r.token_ids for r in res] == want
    for r, q in zip(res, constrained, strict=False):
        jsonschema.validate(json.loads(r.text), q.grammar.schema)  # type: ignore[union-attr]


def test_threaded_scheduler_constrained_stream() -> None:
    spec = GrammarSpec.json_schema(SCHEMAS["weather"], COMPACT)
    with NativeScheduler(model(), tokenizer=ByteTokenizer(), numba_threads=1, max_running=2) as sched:
        h = sched.admit(Request(prompts(1)[0], max_new_tokens=64, grammar=spec))
        text = "".join(h.pieces(timeout=60))
        r = h.result(timeout=60)
    assert text == r.text and r.finish_reason is FinishReason.STOP
    jsonschema.validate(json.loads(text), SCHEMAS["weather"])


# -- Gemma 3 270M ----------------------------------------------------------------------------------
GEMMA_SCHEMAS = {  # additionalProperties false: a 270M base model otherwise invents keys until max tokens
    "weather": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                 "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": False},
    "person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                                "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30},
                                                            "maxItems": 3}},
               "required": ["name", "age", "hobbies"], "additionalProperties": False},
    "book": {"type": "object", "properties": {"title": {"type": "string", "maxLength": 60},
                                              "year": {"type": "integer"}, "available": {"type": "boolean"}},
             "required": ["title", "year", "available"], "additionalProperties": False},
}
GEMMA_ASK = {"weather": "What is the weather in Paris? Answer in JSON.",
             "person": "Describe a fictional person as JSON with name, age and hobbies.",
             "book": "Give me a JSON record of a famous book."}


@pytest.fixture(scope="module")
def gemma():  # type: ignore[no-untyped-def]
    from engine import load_model
    from engine.gguf.aliases import resolve_model
    from engine.tokenizer import tokenizer as T
    from engine.tokenizer.tokenizer import load_tokenizer

    path = resolve_model("gemma3-270m")
    yield load_model(str(path), resident=True, progress=False), load_tokenizer(str(path))
    T.clear_memo()


@pytest.mark.gemma
@pytest.mark.slow
def test_gemma_constrained_outputs(gemma) -> None:  # type: ignore[no-untyped-def]
    model_, tok = gemma

    def chat(q: str) -> list[int]:
        return tok.encode_chat([{"role": "user", "content": q}])

    call = GrammarSpec.sequence(PREFIX, GrammarSpec.json_schema(GEMMA_SCHEMAS["weather"]), SUFFIX)
    reqs = [Request(chat(GEMMA_ASK[k]), max_new_tokens=80, grammar=GrammarSpec.json_schema(s))
            for k, s in GEMMA_SCHEMAS.items()]
    # any object: this base 270M model seldom closes one it may fill freely; this prompt it does close
    reqs += [Request(chat('Output JSON {"status": ...} with status "done".'), max_new_tokens=80,
                     grammar=GrammarSpec.json_object(COMPACT)),
             Request(chat("What is the weather in Tokyo?"), max_new_tokens=80, grammar=call)]
    free = Request(chat("What is the weather in Tokyo?"), max_new_tokens=12)
    with NativeScheduler(model_, tokenizer=tok, max_running=len(reqs) + 1) as sched:
        sched.warm_grammar()
        hs = [sched.admit(r) for r in reqs + [free]]
        res = [h.result(timeout=600) for h in hs]
        alone = sched.admit(reqs[-1]).result(timeout=600)  # the tool call again, now with no batch mates
        free_alone = sched.admit(free).result(timeout=600)
    for r, k in zip(res, GEMMA_SCHEMAS, strict=False):
        assert r.finish_reason is FinishReason.STOP, r.text
        jsonschema.validate(json.loads(r.text), GEMMA_SCHEMAS[k])
    assert res[3].finish_reason is FinishReason.STOP and isinstance(json.loads(res[3].text), dict)
    tool = res[4]
    assert tool.finish_reason is FinishReason.STOP and tool.text.startswith(PREFIX) and tool.text.endswith(SUFFIX)
    jsonschema.validate(json.loads(tool.text[len(PREFIX):-len(SUFFIX)]), GEMMA_SCHEMAS["weather"])
    assert alone.token_ids == tool.token_ids
    s, want = Session(model_), []  # the free lane: the plain Session's greedy tokens, with or without batch mates
    logits = s.prefill(list(free.prompt))  # type: ignore[arg-type]
    while len(want) < 12 and int(np.argmax(logits)) not in tok.eos_ids:
        want.append(int(np.argmax(logits)))
        logits = s.step(want[-1])
    s.free()
    assert res[5].token_ids == free_alone.token_ids == want
    with pytest.raises(EngineError, match="invalid grammar"):
        NativeScheduler(model_, tokenizer=tok, thread=False).admit(
            Request(chat("x"), grammar=GrammarSpec.json_schema({"type": "object", "required": 3})))
