"""Shared helpers for the scheduler tests: the synthetic model and a solo greedy reference."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import lru_cache

import numpy as np

from engine import Session
from engine.model.forward import Model
from engine.model.synthetic import SYNTHETIC_CONFIG, synthetic_weights
from engine.sched.draft import Drafter
from engine.sched.lane import LaneResult, Request
from engine.sched.scheduler import NativeScheduler

# numba keeps its default thread count here (it was set to 1 at import, for every test of the session):
# the parallel kernels must run on several threads for the batch-invariance claims to be about threads
# (tests/support/numba_threads.py checks that they did).


@lru_cache(maxsize=1)
def model() -> Model:
    """The synthetic checkpoint with a stronger attention path and an untied random head.

    The stock synthetic model (tied head, large embeddings) greedily repeats the last prompt token,
    so comparing outputs would not notice a wrong KV cache. This variant's greedy output depends on
    the whole context (changing the first prompt token changes most later tokens) and keeps logit
    gaps ~0.1, far above float32 noise.
    """
    w = synthetic_weights()
    for lw in w.layers:
        lw.wo = (lw.wo * 3.0).astype(np.float32)
    w.token_embd = (w.token_embd * 0.5).astype(np.float32)
    w.output = (np.random.default_rng(7).standard_normal((256, 64)) * 0.5).astype(np.float32)
    m = Model(dataclasses.replace(SYNTHETIC_CONFIG, tied_embeddings=False), w, name="synthetic-mix")
    m.prefill_blas = False  # Session.prefill on the row-stable kernels: the solo reference is bit-exact
    return m


@lru_cache(maxsize=4096)
def _solo(prompt: tuple[int, ...], n: int, chunk: int) -> tuple[int, ...]:
    s = Session(model())
    for i in range(0, len(prompt), chunk):  # same absolute chunk boundaries as the scheduler
        logits = s.prefill(list(prompt[i : i + chunk]))
    out = [int(np.argmax(logits))]
    while len(out) < n:
        out.append(int(np.argmax(s.step(out[-1]))))
    s.free()
    return tuple(out)


def solo(prompt: list[int], n: int, chunk: int = 128) -> list[int]:
    """Greedy tokens of one request run alone on a plain Session (no scheduler, no sharing)."""
    return list(_solo(tuple(prompt), n, chunk))


def rand_prompt(rng: np.random.Generator, n: int) -> list[int]:
    return [int(t) for t in rng.integers(0, 256, size=n)]


@lru_cache(maxsize=1)
def model_blas() -> Model:
    """The same weights with BLAS prefill (as a real model runs): prefill rows differ from decode rows
    in the last bits, which is what the scheduler's chunking rules must keep batch/cache-independent."""
    m = model()
    blas = Model(m.config, m.weights, name="synthetic-mix-blas")
    blas.prefill_blas = True
    return blas


# sixteen short prompts of different kinds (the Gemma tests of the distributed engine run them as 16 lanes)
GEMMA_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "2 + 2 =", "The mitochondria",
                 "import numpy as np\n", "Dear Sir or Madam,", "The weather today", "SELECT * FROM", "In 1492,",
                 "The quick brown fox", "Water boils at", "My favourite book is", "The recipe calls for",
                 "Quantum computing is", "Translate to French: cat ->"]


class ScriptedDrafter(Drafter):
    """Drafts from known answers (prompt -> the tokens the lane will emit): the right continuation with
    every `wrong_every`-th generated position changed (0: never; 1: always wrong), so the verification,
    not the drafter, is what decides. Counts its calls."""

    def __init__(self, answers: dict[tuple[int, ...], list[int]], k: int = 4, wrong_every: int = 3,
                 vocab: int = 256) -> None:
        super().__init__("ngram", k)
        self.answers, self.k, self.wrong_every, self.vocab = answers, k, wrong_every, vocab
        self.calls = 0

    def propose(self, state, prompt, generated, scope):  # type: ignore[no-untyped-def]
        self.calls += 1
        want = self.answers[tuple(prompt)]
        at = len(generated)
        draft = list(want[at:at + self.k])
        for i in range(len(draft)):
            if self.wrong_every and (at + i) % self.wrong_every == self.wrong_every - 1:
                draft[i] = (draft[i] + 1) % self.vocab
        return draft

    def choose(self, states, drafts, generated, base_rows, cost, positions=None, base_positions=0, lanes=1, held=0):  # type: ignore[no-untyped-def]
        return drafts  # the script decides the lengths

    def verified(self, state, drafted, accepted):  # type: ignore[no-untyped-def]
        pass


def use_drafter(sched: NativeScheduler, drafter: Drafter) -> NativeScheduler:
    """Put `drafter` in a scheduler built with speculation on (its lanes then draft from it)."""
    assert sched.drafter is not None
    sched.drafter = sched.output.drafter = drafter
    return sched


def run_to_end(sched: NativeScheduler, reqs: list[Request],
               after_step: Callable[[NativeScheduler], None] | None = None) -> list[LaneResult]:
    """Admit `reqs` to a thread=False scheduler and step it until every one is finished (`after_step` runs
    after each step); their results, in order."""
    hs = [sched.admit(r) for r in reqs]
    while sched.step():
        if after_step is not None:
            after_step(sched)
    return [h.result(0) for h in hs]
