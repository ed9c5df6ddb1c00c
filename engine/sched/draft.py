"""Drafts for speculative decoding: tokens a lane is likely to emit next, guessed without a draft model.

Agents re-emit what they read: a file rewritten with one change, a diff, the same tool-call shapes turn after
turn. A drafter proposes the continuation of the longest recent match of the lane's last tokens; the scheduler
verifies the draft in the lane's rows of the next step (engine/sched/output.py: `after_verify`), so a draft
costs rows of compute, never a wrong token.

- `ngram` (prompt lookup): the lane's own prompt and output so far.
- `suffix`: the same over the lane's tokens, then over the outputs of recent requests in the same scope
  (a `SuffixStore` per scheduler): a tool call repeated across requests drafts from the last one. A
  request's tokens enter the store only if its KV scope may be shared (the prefix cache's rule: tainted
  requests never), and drafts for a request come only from requests of its own scope.

A lookup finds the positions holding the context's last token (numpy, one compare over the log), extends
each match backwards up to MAX_N tokens, and drafts what followed the latest of the longest: no index to
build or hold (a per-n-gram dict over a 16k-token prompt was 100k+ entries a lane).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from engine.sched.step_cost import StepCosts

SPECULATIVE_MODES = ("off", "ngram", "suffix")
MIN_N = 2  # a single repeated token drafts too often on plain text (measured: bench/spec.py)
MAX_N = 8  # longer suffixes match rarely; 8 catches a repeated line's context
LONG_N = 6  # a match this long or longer keeps its own keep rate (LaneDraft.rates)


class TokenLog:
    """A growing token sequence (numpy, capacity doubling) and the longest-match lookup over it."""

    def __init__(self, ids: list[int] | np.ndarray | None = None) -> None:
        self._buf = np.zeros(64, dtype=np.int64)
        self.n = 0
        if ids is not None and len(ids):
            self.extend(ids)

    def extend(self, ids: list[int] | np.ndarray) -> None:
        need = self.n + len(ids)
        if need > self._buf.size:
            grown = np.zeros(max(need, 2 * self._buf.size), dtype=np.int64)
            grown[:self.n] = self._buf[:self.n]
            self._buf = grown
        self._buf[self.n:need] = ids
        self.n = need

    @property
    def tokens(self) -> np.ndarray:
        return self._buf[:self.n]

    def match(self, tail: np.ndarray, k: int, exclude_end: bool = False) -> tuple[int, list[int]]:
        """(n, up to k tokens) that followed the latest occurrence of the longest suffix of `tail` (n tokens,
        MIN_N <= n <= MAX_N) found here; (0, []) when none. exclude_end: `tail` is this log's own end (so
        the occurrence at the very end, which nothing follows yet, is not a match)."""
        t = self.tokens
        m = min(MAX_N, tail.size)
        if m < MIN_N or t.size < MIN_N + 1:
            return 0, []
        last = t.size - 1 if exclude_end else t.size  # candidates c: t[c] matches tail[-1], c + 1 < last + 1
        cand = np.flatnonzero(t[:max(0, last)] == tail[-1])
        cand = cand[cand + 1 < t.size]  # something follows
        cand = cand[t[cand + 1] >= 0]  # ...and not a separator (SuffixStore: an entry's end)
        if cand.size == 0:
            return 0, []
        length = np.ones(cand.size, dtype=np.int64)
        alive = np.ones(cand.size, dtype=bool)
        for j in range(1, m):  # extend each candidate's match backwards, one token at a time
            ok = alive & (cand - j >= 0)
            ok[ok] = t[cand[ok] - j] == tail[-1 - j]
            alive = ok
            length += alive
            if not alive.any():
                break
        best = int(length.max())
        if best < MIN_N:
            return 0, []
        c = int(cand[np.flatnonzero(length == best)[-1]])  # the latest of the longest
        follows = t[c + 1:c + 1 + k]
        stop = np.flatnonzero(follows < 0)  # a draft ends where its entry does
        return best, (follows[:stop[0]] if stop.size else follows).tolist()


@dataclass
class KeepRate:
    """Decayed counts of draft tokens kept and of tokens tried (kept ones + the first miss): kept / tried
    estimates the chance a draft token is kept given the one before was."""

    kept: float = 1.2
    tried: float = 2.0

    @property
    def rate(self) -> float:
        return self.kept / self.tried

    def learn(self, drafted: int, accepted: int, decay: float) -> None:
        self.kept = self.kept * decay + accepted
        self.tried = self.tried * decay + accepted + (accepted < drafted)


@dataclass
class LaneDraft:
    """A lane's drafting state: its own index, what it drafted and kept, and its pauses."""

    log: TokenLog = field(default_factory=TokenLog)
    misses: int = 0  # drafts in a row with nothing accepted
    cooldown: int = 0  # steps left without drafting (after repeated misses)
    pause: int = 8  # the next cooldown's length: doubles while drafts keep missing, back to 8 on a kept token
    # keep rates after a short match and after a long one (LONG_N tokens or more): how long a match the
    # draft follows says much of how far it holds (the edit replay of bench/spec_bound.py: the first token
    # kept 0.98 of the time after 8 matched tokens, 0.68 after 2), and one rate for both let a run of short
    # misses hold back a copied file's drafts, and the reverse
    rates: tuple[KeepRate, KeepRate] = field(default_factory=lambda: (KeepRate(), KeepRate()))
    long: bool = False  # the latest draft followed a long match
    shadow: tuple[int, int, bool] | None = None  # (position, token, long): a first draft token not verified, checked free

    @property
    def keep_rate(self) -> float:
        """The rate for the latest draft's kind of match."""
        return self.rates[self.long].rate


class SuffixStore:
    """The outputs of recent finished requests, per scope (the oldest dropped past `capacity` tokens a
    scope): what `suffix` drafts from after the lane's own tokens. A scope's entries are one TokenLog, each
    entry followed by SEP, so one lookup scans them all and no match or draft runs from one into the next
    (a log an entry was a scan an entry: 16 lanes over 48 stories' outputs spent 2.7 ms a step looking up,
    5% of the step, drafting nothing)."""

    SEP = -1  # never a token id

    def __init__(self, capacity_tokens: int = 65536) -> None:
        self.capacity = capacity_tokens
        self._logs: dict[str, TokenLog] = {}  # a scope's entries, each followed by SEP: log.n - entries tokens
        self._entries: dict[str, deque[int]] = {}  # each entry's length, oldest first

    def add(self, scope: str, ids: list[int]) -> None:
        if len(ids) < MIN_N + 1:
            return
        entries = self._entries.setdefault(scope, deque())
        log = self._logs.setdefault(scope, TokenLog())
        entries.append(len(ids))
        log.extend([*ids, self.SEP])
        drop = 0  # leading log positions the dropped entries held (tokens and separators)
        while log.n - drop - len(entries) > self.capacity and len(entries) > 1:
            drop += entries.popleft() + 1
        if drop:
            self._logs[scope] = TokenLog(log.tokens[drop:])

    def match(self, scope: str, tail: np.ndarray, k: int) -> tuple[int, list[int]]:
        """The longest match among the scope's entries, the most recent on a tie."""
        log = self._logs.get(scope)
        return log.match(tail, k) if log is not None else (0, [])


class Drafter:
    """Proposes drafts for lanes, chooses what the step verifies, and learns from what it kept.

    A lane proposes the longest draft it finds (up to `max_tokens`). Its j-th token is kept with about
    p^j, p the lane's keep rate after a match as long as this draft's (short or long: LaneDraft.rates);
    `choose` spends the step's rows on the draft tokens worth most, as many as maximise the tokens the step
    is expected to give per ms it costs (`StepCosts`: a staircase of lane groups, so one lane drafts 3 or 7
    tokens rather than 8, and a batch of 16 drafts 0, 8 or 16 rows in all, not 1 that costs a pass). A lane
    whose first draft token was not worth its row learns anyway: the next step's token shows whether it
    would have been kept (`shadow`). Three drafts in a row whose first token missed (verified, or checked as
    a shadow) pause the lane's drafting (8 steps, doubling up to MAX_PAUSE while it keeps missing): text
    that does not repeat costs little lookup time, also where no draft is worth its rows (16 lanes of
    stories: drafts were proposed and looked up every step, and never chosen)."""

    MAX_PAUSE = 128
    DECAY = 0.9  # per verification: the keep rate follows the text as it changes (prose, then a copied file)
    SURE = 0.98  # a keep rate is never taken for certainty
    # Drafts must raise the step's expected rate by this much: what StepCosts does not see (each lane's
    # own overhead, rows' attention past its linear term); bench/spec_rows.py prints model and truth.
    MARGIN = 1.1
    # The choice's objective. Fair: the sum over the step's lanes of log(their rate) (proportional fairness):
    # a draft token is worth what it adds to log(1 + its lane's expected gain), against each lane's share of
    # the dearer step. The step's tokens per ms (False) spent the rows on a few sure lanes and slowed every
    # other lane of the batch: 16 lanes of stories 0.90-0.96x with it, 0.98-1.00x fair (bench/spec.py's
    # workload, in turn in one process); a lane alone chooses the same either way.
    FAIR = True

    def __init__(self, mode: str, max_tokens: int, store: SuffixStore | None = None) -> None:
        self.mode, self.max_tokens = mode, max_tokens
        self.store = store if store is not None or mode != "suffix" else SuffixStore()

    def propose(self, state: LaneDraft, prompt: list[int], generated: list[int], scope: str | None) -> list[int]:
        """A draft (the longest found, up to max_tokens) to follow prompt + generated (the lane's last token,
        not yet fed, ends it)."""
        log, have = state.log, state.log.n
        if have < len(prompt):
            log.extend(prompt[have:])
            have = len(prompt)
        if have < len(prompt) + len(generated):
            log.extend(generated[have - len(prompt):])
        if state.shadow is not None:
            at, token, long = state.shadow
            if at < len(generated):
                kept = generated[at] == token
                state.rates[long].learn(1, int(kept), self.DECAY)
                self._kept_or_missed(state, kept)  # as a verified draft of one token would
                state.shadow = None
        if state.cooldown > 0:
            state.cooldown -= 1
            return []
        tail = log.tokens[-MAX_N:]
        n, draft = log.match(tail, self.max_tokens, exclude_end=True)
        if self.store is not None and scope is not None and n < MAX_N:
            n2, other = self.store.match(scope, tail, self.max_tokens)
            if n2 > n:
                n, draft = n2, other
        state.long = n >= LONG_N
        return draft

    def choose(self, states: list[LaneDraft], drafts: list[list[int]], generated: list[int], base_rows: int,
               cost: StepCosts, positions: list[int] | None = None, base_positions: int = 0,
               lanes: int = 1, held: int = 0) -> list[list[int]]:
        """The drafts cut to what the step verifies: lane i keeps its first n_i tokens, the n_i chosen to
        maximise the sum over the step's lanes of log(1 + g_i) - log(cost(base_rows + sum n_i, positions they
        attend to)), g_i the sum of lane i's kept tokens' p_i^j (FAIR; else the step's rate, (base_rows + sum
        g_i) / cost), by at least MARGIN in each lane's rate. base_rows: the step's rows without drafts, one a
        decoding lane and a prefill chunk's, each worth one to the step's rate (a prompt row is work the step
        does anyway: draft rows must pay at its rate, not a decode-only one), attending to base_positions in
        all, from `lanes` lanes (at least the drafting ones: a lane each in the fair sum), holding `held` positions
        in all (what their first rows attend to); positions: each drafting
        lane's context (what each of its draft rows attends to; none: the attention is not counted);
        generated: each drafting lane's count of emitted tokens (where its shadow is checked)."""
        # a draft token's worth: its chance p^j, or (fair) what it adds to log(1 + its lane's expected gain)
        values: list[tuple[float, int]] = []
        for i, (state, draft) in enumerate(zip(states, drafts, strict=True)):
            p, v, g = min(state.keep_rate, self.SURE), 1.0, 0.0
            for _ in draft:
                v *= p
                values.append((math.log1p(g + v) - math.log1p(g) if self.FAIR else v, i))
                g += v
        values.sort(key=lambda x: -x[0])  # stable: a lane's tokens stay in order (their values fall)
        at = positions if positions is not None else [0] * len(drafts)
        n_lanes = max(lanes, len(drafts))
        reach = base_positions
        base_cost = cost(base_rows, base_positions, lanes, held)
        best, best_score, score = 0, 0.0, 0.0
        for d, (v, i) in enumerate(values, 1):
            reach += at[i]
            score += v
            grown = cost(base_rows + d, reach, lanes, held) / base_cost
            if self.FAIR:  # every lane's rate in the product: sum of log(1 + gain) against each lane's slower step
                better = score - n_lanes * math.log(self.MARGIN * grown)
            else:  # the step's tokens per ms
                better = math.log((base_rows + score) / base_rows) - math.log(self.MARGIN * grown)
            if better > best_score:
                best, best_score = d, better
        take = [0] * len(drafts)
        for _, i in values[:best]:
            take[i] += 1
        for state, draft, n, at in zip(states, drafts, take, generated, strict=True):
            if draft and not n:
                state.shadow = (at, draft[0], state.long)
        return [d[:n] for d, n in zip(drafts, take, strict=True)]

    def verified(self, state: LaneDraft, drafted: int, accepted: int) -> None:
        state.rates[state.long].learn(drafted, accepted, self.DECAY)
        self._kept_or_missed(state, accepted > 0)

    def _kept_or_missed(self, state: LaneDraft, kept: bool) -> None:
        """A draft's first token was kept (back to short pauses) or missed (the third miss in a row pauses)."""
        if kept:
            state.pause, state.misses = 8, 0
            return
        state.misses += 1
        if state.misses >= 3:
            state.cooldown, state.misses = state.pause, 0
            state.pause = min(self.MAX_PAUSE, 2 * state.pause)

    def finished(self, scope: str | None, output: list[int]) -> None:
        if self.store is not None and scope is not None:
            self.store.add(scope, output)
