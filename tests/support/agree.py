"""Resident vs plain agreement on one prompt: what the resident-model tests of every model check."""

from __future__ import annotations

import numpy as np

from engine import Session
from engine.model.forward import Model


def greedy(model: Model, ids: list[int], n: int = 16) -> tuple[list[int], np.ndarray]:
    """16 greedy tokens and the logits of every step (decode runs the GEMV kernels, prefill the tiles)."""
    s = Session(model)
    logits = s.prefill(ids)
    rows = [logits.copy()]
    out: list[int] = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = s.step(out[-1])
        rows.append(logits.copy())
    return out, np.stack(rows)


def agree(res: Model, plain: Model, ids: list[int], prompt_tol: float, decode_tol: float) -> tuple[float, float]:
    """max |logit diff| resident vs plain over every prompt position, and over 16 greedy decode steps."""
    _, lr = res.hidden_states(ids)
    _, lp = plain.hidden_states(ids)
    assert np.array_equal(lr.argmax(axis=1), lp.argmax(axis=1))  # same argmax at every position
    prompt = float(np.abs(lr - lp).max())  # every position, not only the last
    assert prompt <= prompt_tol, f"prompt positions: max |logit diff| {prompt:.2e} > {prompt_tol}"
    gr, sr = greedy(res, ids)
    gp, sp = greedy(plain, ids)
    assert gr == gp
    decode = float(np.abs(sr - sp).max())  # the decode steps' logits (the GEMV kernels) too
    assert decode <= decode_tol, f"decode steps: max |logit diff| {decode:.2e} > {decode_tol}"
    return prompt, decode


def serial_steps(model: Model, prompts: list[list[int]]) -> tuple[list[np.ndarray], list[Session]]:
    """Each prompt's next-step logits (token: its last + 1) in a Session of its own, and fresh
    Sessions prefilled with the same prompts, for the caller to step as one batch."""
    serial = []
    for p in prompts:
        s = Session(model)
        s.prefill(p)
        serial.append(s.step(p[-1] + 1))
    sessions = [Session(model) for _ in prompts]
    for s, p in zip(sessions, prompts, strict=False):
        s.prefill(p)
    return serial, sessions
