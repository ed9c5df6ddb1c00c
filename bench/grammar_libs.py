"""Which grammar library for constrained decoding: xgrammar, llguidance and outlines-core on numpy logits.

    pip install xgrammar outlines-core   # not dependencies of fak (llguidance is)
    python bench/grammar_libs.py [--vocab gemma3-270m,PATH.gguf] [--reps 5] [--libs llguidance,xgrammar,outlines]

For each vocabulary (the GGUF's own tokenizer, engine/tokenizer) and each library: the tokenizer-level
setup, the compile of three JSON schemas, then a replay of a realistic output (a schema instance encoded
by the model's tokenizer): per token, fill the 32-bit bitmask of allowed tokens (the library), apply it
to a float32 logits row (numpy: -inf where the bit is clear, the same for every library) and consume the
token (the library). Times per token in µs: median and p99 over every token of every replay, the mean
and the worst, how many tokens took over 1 ms; "fastest replay": per token position the fastest of the
replays (fill + consume), so what remains is the library's own cost there, not a load spike; "matcher ms" is the
per-request start (llguidance builds its parser there: its "compile" is only the schema -> grammar text). No
torch on this path (xgrammar imports it anyway: said so in the output).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    "weather": (
        {"type": "object", "properties": {"location": {"type": "string"},
                                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
         "required": ["location", "unit"], "additionalProperties": False},
        {"location": "San Francisco, CA", "unit": "celsius"}),
    "person": (
        {"type": "object", "properties": {
            "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
            "emails": {"type": "array", "items": {"type": "string"}},
            "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                                         "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["street", "city", "zip"]}},
         "required": ["name", "age", "emails", "address"]},
        {"name": "Ada Lovelace", "age": 36, "emails": ["ada@example.com", "countess@analytical.engine"],
         "address": {"street": "12 St James's Square", "city": "London", "zip": "12345"}}),
    "orders": (
        {"type": "object", "properties": {
            "orders": {"type": "array", "items": {"type": "object", "properties": {
                "id": {"type": "integer"}, "sku": {"type": "string"}, "qty": {"type": "integer"},
                "price": {"type": "number"}, "gift": {"type": "boolean"},
                "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
                "required": ["id", "sku", "qty", "price", "gift", "note"]}}},
         "required": ["orders"]},
        {"orders": [{"id": i, "sku": f"SKU-{1000 + 7 * i}", "qty": i % 4 + 1, "price": 9.99 + i,
                     "gift": i % 2 == 0, "note": None if i % 3 else f"leave at door {i}"} for i in range(6)]}),
}


def vocab_of(tok: Any) -> tuple[list[bytes], list[int], list[int]]:
    """Token bytes (b"" for control / unknown tokens and stop ids), the special ids, the stop ids."""
    from engine.grammar.vocab import grammar_vocab

    v = grammar_vocab(tok)
    return v.pieces, sorted(v.special), list(v.eos_ids)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def apply_mask(logits: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    """The engine's kernel (engine/kernels/bitmask.py), in place on a reused row."""
    from engine.kernels.bitmask import mask_logits

    mask_logits(logits, bitmask)
    return logits


class LLG:
    name = "llguidance"

    def __init__(self, pieces: list[bytes], special: list[int], eos: list[int], tok: Any) -> None:
        import llguidance

        marked = set(special)

        class Wrap:
            eos_token_id, bos_token_id = eos[0], None
            special_token_ids = special
            tokens = [b"\xff" + tok.token_bytes(i) if i in marked else p for i, p in enumerate(pieces)]

            def __call__(self, s: bytes) -> list[int]:
                return list(tok.encode(s.decode("utf-8", "replace"), add_special=False))

        self.llg = llguidance
        self.tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrap()), eos_token=eos)
        self.n = len(pieces)

    def compile(self, schema: dict[str, Any]) -> Any:
        g = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        err = self.llg.LLMatcher.validate_grammar(g, self.tok)
        if err:
            raise ValueError(err)
        return g

    def matcher(self, compiled: Any) -> Any:
        m = self.llg.LLMatcher(self.tok, compiled)
        assert not m.is_error(), m.get_error()
        return m

    def fill(self, m: Any, bitmask: np.ndarray) -> None:
        m.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)

    def consume(self, m: Any, t: int) -> None:
        if not m.consume_token(t):
            raise ValueError(m.get_error())

    def done(self, m: Any) -> bool:
        return bool(m.is_accepting())


class XGR:
    name = "xgrammar"

    def __init__(self, pieces: list[bytes], special: list[int], eos: list[int], tok: Any) -> None:
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo(pieces, xgrammar.VocabType.RAW, vocab_size=len(pieces), stop_token_ids=eos)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)

    def compile(self, schema: dict[str, Any]) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema))

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m: Any, bitmask: np.ndarray) -> None:
        m.fill_next_token_bitmask(bitmask[None, :])  # numpy through DLPack

    def consume(self, m: Any, t: int) -> None:
        if not m.accept_token(t):
            raise ValueError(f"token {t} rejected")

    def done(self, m: Any) -> bool:
        return bool(m.is_completed() or m.is_terminated())


class OC:
    name = "outlines-core"

    def __init__(self, pieces: list[bytes], special: list[int], eos: list[int], tok: Any) -> None:
        import outlines_core

        self.oc = outlines_core
        table: dict[bytes, list[int]] = {}
        for i, p in enumerate(pieces):
            if p and i not in eos:
                table.setdefault(p, []).append(i)
        self.vocab = outlines_core.Vocabulary(eos[0], table)

    def compile(self, schema: dict[str, Any]) -> Any:
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Index(regex, self.vocab)

    def matcher(self, compiled: Any) -> Any:
        return self.oc.Guide(compiled)

    def fill(self, m: Any, bitmask: np.ndarray) -> None:
        m.write_mask_into(bitmask.ctypes.data, bitmask.size, bitmask.itemsize)

    def consume(self, m: Any, t: int) -> None:
        m.advance(t, return_tokens=False)

    def done(self, m: Any) -> bool:
        return bool(m.is_finished())


LIBS = {"llguidance": LLG, "xgrammar": XGR, "outlines": OC}


def measure(lib_name: str, tok: Any, reps: int, separators: tuple[str, str]) -> dict[str, Any]:
    pieces, special, eos = vocab_of(tok)
    out: dict[str, Any] = {"lib": lib_name}
    t0 = time.perf_counter()
    try:
        lib = LIBS[lib_name](pieces, special, eos, tok)
    except Exception as exc:
        out["error"] = f"setup: {type(exc).__name__}: {exc}"
        return out
    out["setup_s"] = time.perf_counter() - t0
    out["torch_imported"] = "torch" in sys.modules
    rng = np.random.default_rng(0)
    raw = rng.standard_normal(len(pieces)).astype(np.float32)
    logits = raw.copy()
    from engine.kernels.bitmask import warmup

    warmup()
    fill_us: list[float] = []
    apply_us: list[float] = []
    consume_us: list[float] = []
    out["compile_s"] = {}
    for name, (schema, instance) in SCHEMAS.items():
        t0 = time.perf_counter()
        try:
            compiled = lib.compile(schema)
        except Exception as exc:
            out["compile_s"][name] = f"{type(exc).__name__}: {str(exc)[:200]}"
            continue
        out["compile_s"][name] = time.perf_counter() - t0
        ids = list(tok.encode(json.dumps(instance, separators=separators), add_special=False))
        base = len(fill_us)
        for rep in range(reps):
            t0 = time.perf_counter()
            m = lib.matcher(compiled)
            out.setdefault("matcher_ms", {}).setdefault(name, []).append((time.perf_counter() - t0) * 1e3)
            bitmask = np.zeros((len(pieces) + 31) // 32, dtype=np.int32)
            for t in ids:
                a = time.perf_counter()
                lib.fill(m, bitmask)
                b = time.perf_counter()
                masked = apply_mask(logits, bitmask)  # (a real row is fresh each step: copied back below)
                c = time.perf_counter()
                if not np.isfinite(masked[t]):
                    out.setdefault("rejected", []).append(f"{name}: token {t} {tok.token_bytes(t)!r} masked")
                    break
                lib.consume(m, t)
                d = time.perf_counter()
                np.copyto(logits, raw)
                fill_us.append((b - a) * 1e6)
                apply_us.append((c - b) * 1e6)
                consume_us.append((d - c) * 1e6)
            out.setdefault("complete", {})[name] = lib.done(m)
            if rep == 0:
                n_tok = len(fill_us) - base
        # per token position, the fastest of the replays: what the library costs there, load spikes aside
        per = [[f + c for f, c in zip(fill_us[base + r * n_tok: base + (r + 1) * n_tok],
                                      consume_us[base + r * n_tok: base + (r + 1) * n_tok], strict=False)] for r in range(reps)]
        out.setdefault("min_of_replays", []).extend(min(col) for col in zip(*per, strict=False))
        out.setdefault("tokens", {})[name] = len(ids)
    if fill_us:
        lib_us = [f + c for f, c in zip(fill_us, consume_us, strict=False)]
        out["fill_us"] = (statistics.median(fill_us), pct(fill_us, 99))
        out["consume_us"] = (statistics.median(consume_us), pct(consume_us, 99))
        out["library_us"] = (statistics.median(lib_us), pct(lib_us, 99))
        out["library_mean_max_us"] = (statistics.fmean(lib_us), max(lib_us))
        out["library_over_1ms"] = sum(x > 1000 for x in lib_us)
        mins = out.pop("min_of_replays")
        out["min_of_replays_us"] = (statistics.median(mins), pct(mins, 99), statistics.fmean(mins), max(mins))
        out["apply_us"] = (statistics.median(apply_us), pct(apply_us, 99))
        out["samples"] = len(fill_us)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", default="gemma3-270m")
    ap.add_argument("--libs", default="llguidance,xgrammar,outlines")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--compact", action="store_true", help="instances without spaces (',' ':') instead of ', ' ': '")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    seps = (",", ":") if a.compact else (", ", ": ")
    if a.worker:  # one library, one vocabulary, in this process (so one library's imports do not tax another)
        from engine.tokenizer import load_tokenizer

        lib, vocab = a.worker.split("@", 1)
        print(json.dumps(measure(lib, load_tokenizer(vocab), a.reps, seps)))
        return
    import os
    import subprocess

    print(f"load avg {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus; separators {seps!r}; {a.reps} replays each")
    for vocab in a.vocab.split(","):
        print(f"\nvocabulary {vocab}")
        print(f"{'library':>13} | {'setup s':>7} | {'compile s (3 schemas)':>22} | {'matcher ms':>10} | "
              f"{'mask µs p50/p99':>16} | {'consume µs':>12} | {'lib total p50/p99':>17} | {'mean/max':>13} | "
              f"{'>1ms':>4} | {'fastest replay p50/p99/mean/max':>31} | {'apply µs':>11} | notes")
        for lib in a.libs.split(","):
            cmd = [sys.executable, __file__, "--worker", f"{lib}@{vocab}", "--reps", str(a.reps)]
            cmd += ["--compact"] if a.compact else []
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                print(f"{lib:>13} | failed: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
                continue
            r = json.loads(p.stdout.strip().splitlines()[-1])
            if "error" in r:
                print(f"{lib:>13} | {r['error']}")
                continue
            comp = " ".join(f"{v:.2f}" if isinstance(v, float) else "ERR" for v in r["compile_s"].values())
            notes = []
            if r.get("torch_imported"):
                notes.append("imports torch")
            notes += [f"{k}: {v}" for k, v in r["compile_s"].items() if not isinstance(v, float)]
            notes += r.get("rejected", [])
            notes += [f"{k} not complete" for k, v in r.get("complete", {}).items() if not v]
            if "fill_us" not in r:
                print(f"{lib:>13} | {r['setup_s']:>7.2f} | {comp:>22} | no samples | {'; '.join(notes)}")
                continue

            def f2(x: list[float]) -> str:
                return f"{x[0]:.1f}/{x[1]:.1f}"
            mm = max(statistics.median(v) for v in r["matcher_ms"].values())
            mean, mx = r["library_mean_max_us"]
            print(f"{lib:>13} | {r['setup_s']:>7.2f} | {comp:>22} | {mm:>10.2f} | {f2(r['fill_us']):>16} | "
                  f"{f2(r['consume_us']):>12} | {f2(r['library_us']):>17} | {mean:>6.1f}/{mx:>6.0f} | "
                  f"{r['library_over_1ms']:>4} | {'/'.join(f'{x:.1f}' for x in r['min_of_replays_us']):>31} | "
                  f"{f2(r['apply_us']):>11} | {r['samples']} tokens; {'; '.join(notes)}",
                  flush=True)


if __name__ == "__main__":
    main()
