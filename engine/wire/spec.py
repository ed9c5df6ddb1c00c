"""Requests, results and logprobs as plain JSON, for the P/D control plane between processes.

Only what a decode worker needs crosses: the prompt travels as ids beside the spec, stop strings stay
with the head (it detokenizes and cuts them, as vLLM's front end does), a monotonic deadline becomes
the seconds left (clocks differ between hosts).
"""

from __future__ import annotations

import time
from dataclasses import asdict, fields
from typing import Any

from engine.grammar.spec import GrammarSpec
from engine.model.sampling import SamplingParams
from engine.sched.lane import FinishReason, Request, TokenLogprob


def grammar_to_json(g: GrammarSpec) -> dict[str, Any]:
    return {"kind": g.kind, "text": g.text, "parts": [grammar_to_json(p) for p in g.parts],
            "separators": list(g.separators) if g.separators is not None else None}


def grammar_from_json(d: dict[str, Any]) -> GrammarSpec:
    sep = d.get("separators")
    return GrammarSpec(d["kind"], d.get("text", ""), tuple(grammar_from_json(p) for p in d.get("parts", ())),
                       (sep[0], sep[1]) if sep is not None else None)


def request_to_json(r: Request, max_new_tokens: int | None = None) -> dict[str, Any]:
    """The decode side's part of a request (no prompt, no stop strings)."""
    s = asdict(r.sampling)
    if s.get("logit_bias") is not None:
        s["logit_bias"] = {str(k): v for k, v in s["logit_bias"].items()}
    return {"max_new_tokens": r.max_new_tokens if max_new_tokens is None else max_new_tokens,
            "stop_ids": list(r.stop_ids), "sampling": s, "stop_on_eos": r.stop_on_eos,
            "deadline_in": None if r.deadline is None else r.deadline - time.monotonic(), "pin_ttl": r.pin_ttl,
            "request_id": r.request_id, "logprobs": r.logprobs,
            "grammar": grammar_to_json(r.grammar) if r.grammar is not None else None,
            "scope": r.scope, "tainted": r.tainted, "verdict": r.verdict}


def request_from_json(d: dict[str, Any], ids: list[int]) -> Request:
    known = {f.name for f in fields(SamplingParams)}
    s = {k: v for k, v in d.get("sampling", {}).items() if k in known}
    if s.get("logit_bias") is not None:
        s["logit_bias"] = {int(k): float(v) for k, v in s["logit_bias"].items()}
    left = d.get("deadline_in")
    return Request(list(ids), max_new_tokens=int(d["max_new_tokens"]), stop_ids=tuple(d.get("stop_ids", ())),
                   sampling=SamplingParams(**s), deadline=None if left is None else time.monotonic() + left,
                   pin_ttl=float(d.get("pin_ttl", 0.0)), stop_on_eos=bool(d.get("stop_on_eos", True)),
                   request_id=str(d.get("request_id", "")), logprobs=d.get("logprobs"),
                   grammar=grammar_from_json(d["grammar"]) if d.get("grammar") else None,
                   scope=str(d.get("scope", "")), tainted=bool(d.get("tainted", False)),
                   verdict=str(d.get("verdict", "ALLOW")))


def logprob_to_json(lp: TokenLogprob) -> list[Any]:
    return [lp.token, lp.logprob, [[t, p] for t, p in lp.top]]


def logprob_from_json(v: list[Any]) -> TokenLogprob:
    return TokenLogprob(int(v[0]), float(v[1]), tuple((int(t), float(p)) for t, p in v[2]))


def finish_reason(text: str) -> FinishReason:
    try:
        return FinishReason(text)
    except ValueError:
        return FinishReason.ERROR
