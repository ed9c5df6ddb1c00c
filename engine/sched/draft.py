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

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

SPECULATIVE_MODES = ("off", "ngram", "suffix")
MIN_N = 2  # a single repeated token drafts too often on plain text (measured: bench/spec.py)
MAX_N = 8  # longer suffixes match rarely and add probes; 8 catches a repeated line's context


class TokenLog:
    """A growing token sequence (numpy, capacity doubling) and the longest-match lookup over it."""

    def __init__(self, ids: list[int] | None = None) -> None:
        self._buf = np.zeros(64, dtype=np.int64)
        self.n = 0
        if ids:
            self.extend(ids)

    def extend(self, ids: list[int]) -> None:
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
        return best, t[c + 1:c + 1 + k].tolist()


@dataclass
class LaneDraft:
    """A lane's drafting state: its own index, the draft length it earns, what it drafted and kept."""

    log: TokenLog = field(default_factory=TokenLog)
    k: int = 4  # the next draft's length (adapts to acceptance)
    misses: int = 0  # drafts in a row with nothing accepted
    cooldown: int = 0  # steps left without drafting (after repeated misses)
    pause: int = 8  # the next cooldown's length: doubles while drafts keep missing, back to 8 on a kept token
    kept: float = 1.2  # decayed counts of draft tokens kept and of tokens tried (kept ones + the first miss):
    tried: float = 2.0  # kept / tried estimates the chance a draft token is kept given the one before was

    @property
    def keep_rate(self) -> float:
        return self.kept / self.tried


class SuffixStore:
    """The outputs of recent finished requests, per scope (the oldest dropped past `capacity` tokens a
    scope): what `suffix` drafts from after the lane's own tokens."""

    def __init__(self, capacity_tokens: int = 65536) -> None:
        self.capacity = capacity_tokens
        self._scopes: dict[str, OrderedDict[int, TokenLog]] = {}
        self._sizes: dict[str, int] = {}
        self._next = 0

    def add(self, scope: str, ids: list[int]) -> None:
        if len(ids) < MIN_N + 1:
            return
        entries = self._scopes.setdefault(scope, OrderedDict())
        entries[self._next] = TokenLog(ids)
        self._next += 1
        self._sizes[scope] = self._sizes.get(scope, 0) + len(ids)
        while self._sizes[scope] > self.capacity and len(entries) > 1:
            _, old = entries.popitem(last=False)
            self._sizes[scope] -= old.n

    def match(self, scope: str, tail: np.ndarray, k: int) -> tuple[int, list[int]]:
        """The longest match among the scope's entries, the most recent on a tie."""
        best: tuple[int, list[int]] = (0, [])
        for log in reversed(self._scopes.get(scope, OrderedDict()).values()):
            found = log.match(tail, k)
            if found[0] > best[0]:
                best = found
                if best[0] == MAX_N:
                    break
        return best


def worth(lanes: int) -> float:
    """The chance of being kept a draft token needs to pay for its row when `lanes` lanes decode together.

    A step costs about a + b * rows: a is reading the weights once (whatever the rows), b a row's compute. On
    these models a / b is about one lane group, 8 rows (Qwen 2.5 0.5B: 9.1 ms for 1 row, ~1.2 ms a row more;
    Gemma 3 270M: 5.9 and ~0.7). Without drafts a step gives `lanes` tokens for a + b * lanes; a draft row
    adds b and gives its chance p of being kept. It pays when p / b >= lanes / (a + b * lanes), that is
    p >= lanes / (8 + lanes): 0.11 for one lane, 0.5 at 8, 0.67 at 16. A lone stream drafts almost anything
    that matches; a full batch, already past the weight reads, only what is nearly sure."""
    return lanes / (ROWS_PER_READ + lanes)


ROWS_PER_READ = 8  # a / b above: rows whose compute costs what one read of the weights does


class Drafter:
    """Proposes drafts for lanes and learns from what the verification kept.

    Adaptive length: a draft fully accepted doubles the next one (up to `max_tokens`); otherwise the next
    is what was accepted plus one. Three drafts in a row with nothing accepted pause the lane's drafting
    (8 steps, doubling up to MAX_PAUSE while it keeps missing), so text that does not repeat pays little: a
    rejected row costs a row of compute (~a quarter of a one-lane step on these models).

    And by the batch: the j-th token of a draft is kept with about p^j (p the lane's keep rate), so a draft
    is cut where p^j falls below `worth(lanes)`. A lane below the bar for even one token still drafts one
    when its last MAX_N tokens all match (a probe: copying text shows itself that way, and the keep rate
    learns from it)."""

    MAX_PAUSE = 128
    DECAY = 0.9  # per verification: the keep rate follows the text as it changes (prose, then a copied file)

    def __init__(self, mode: str, max_tokens: int, store: SuffixStore | None = None) -> None:
        self.mode, self.max_tokens = mode, max_tokens
        self.store = store if store is not None or mode != "suffix" else SuffixStore()

    def propose(self, state: LaneDraft, prompt: list[int], generated: list[int], scope: str | None,
                lanes: int = 1) -> list[int]:
        """A draft to follow prompt + generated (the lane's last token, not yet fed, ends it), for a step of
        `lanes` decoding lanes."""
        log, have = state.log, state.log.n
        if have < len(prompt):
            log.extend(prompt[have:])
            have = len(prompt)
        if have < len(prompt) + len(generated):
            log.extend(generated[have - len(prompt):])
        if state.cooldown > 0:
            state.cooldown -= 1
            return []
        k = max(1, min(state.k, self.max_tokens, self.paying(state.keep_rate, lanes)))
        tail = log.tokens[-MAX_N:]
        n, draft = log.match(tail, k, exclude_end=True)
        if self.store is not None and scope is not None and n < MAX_N:
            n2, other = self.store.match(scope, tail, k)
            if n2 > n:
                n, draft = n2, other
        if state.keep_rate < worth(lanes) and n < MAX_N:
            return []  # not even one token pays at this batch, and no probe
        return draft

    def paying(self, p: float, lanes: int) -> int:
        """Draft tokens that pay (p^j >= worth(lanes)), at most max_tokens."""
        bar, j, chance = worth(lanes), 0, 1.0
        while j < self.max_tokens and chance * p >= bar:
            chance *= p
            j += 1
        return j

    def verified(self, state: LaneDraft, drafted: int, accepted: int) -> None:
        state.kept = state.kept * self.DECAY + accepted
        state.tried = state.tried * self.DECAY + accepted + (accepted < drafted)
        if accepted:
            state.pause = 8
        if accepted >= drafted:
            state.k = min(self.max_tokens, max(state.k, drafted) * 2)
            state.misses = 0
            return
        state.k = max(1, accepted + 1)
        state.misses = state.misses + 1 if accepted == 0 else 0
        if state.misses >= 3:
            state.cooldown, state.misses = state.pause, 0
            state.pause = min(self.MAX_PAUSE, 2 * state.pause)

    def finished(self, scope: str | None, output: list[int]) -> None:
        if self.store is not None and scope is not None:
            self.store.add(scope, output)
