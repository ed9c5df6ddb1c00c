"""What speculation can reach on a host, given its step costs: the edit workload's greedy outputs replayed.

    python bench/spec_bound.py [--context 500] [--new 160] [--spec-tokens 8] [--mode ngram|suffix]

bench/spec.py measures the speed-up; this prints what bounds it. The edit prompts of bench/spec.py are
decoded once without speculation (Qwen2.5-Coder 0.5B, resident, greedy); then each output is replayed
token by token through the scheduler's own drafter (`engine.sched.draft.Drafter`: propose, choose,
verified: the calls the scheduler makes), with each step priced on a staircase of step costs. Two
policies per staircase:
  choose  the scheduler's: drafts cut by the lane's keep rate against the step's cost;
  exact   each step verifies exactly the draft tokens that will be kept (no wasted row, no missed one):
          what a perfect keep-rate estimate would make of these drafts (a per-step bound: a choice that
          steps differently meets different drafts, so it can land a little above it).
Staircases: this host's (`step_cost.measure` at --context tokens), the Zen 4 figures the scheduler
assumes unwarmed (`step_cost.ZEN4_QWEN`), and this host's one-row cost with an 8-row step of 3.0x, 2.5x and
2.0x it (2-7 rows in proportion): where a verification row's compute lands. The ratio is time without
speculation (a one-row step a token) over time with it.
"""

from __future__ import annotations

import argparse

from spec import edit_prompts, run  # bench/spec.py (the script's own directory is on sys.path)

from engine.sched.draft import Drafter, LaneDraft, SuffixStore
from engine.sched.scheduler import NativeScheduler
from engine.sched.step_cost import ZEN4_QWEN, StepCosts, measure
from fak.runtime.boot import SchedOptions, boot


def replay(prompts: list[list[int]], outs: list[list[int]], cost: StepCosts, mode: str, exact: bool,
           spec_tokens: int) -> tuple[float, float]:
    """(speed-up against one row a token, tokens a drafting step) over the prompts in turn."""
    store = SuffixStore() if mode == "suffix" else None
    plain = spent = 0.0
    drafting = emitted_drafting = 0
    for prompt, out in zip(prompts, outs, strict=True):
        drafter, state = Drafter(mode, spec_tokens, store), LaneDraft()
        t = 1  # the first token comes from the prompt's prefill: decode starts after it
        while t < len(out):
            draft = drafter.propose(state, prompt, out[:t], "bench")
            kept = 0
            while kept < len(draft) and t + kept < len(out) and draft[kept] == out[t + kept]:
                kept += 1
            cut = draft[:kept] if exact else drafter.choose([state], [draft], [t], 1, cost)[0]
            kept = min(kept, len(cut))
            if cut:
                drafter.verified(state, len(cut), kept)
                drafting += 1
                emitted_drafting += 1 + kept
            spent += cost(1 + len(cut))
            t += 1 + kept
        plain += cost(1) * (len(out) - 1)
        drafter.finished("bench", out)
    return plain / spent, emitted_drafting / max(1, drafting)


def scaled(one: float, eight: float, passes: dict[int, float]) -> StepCosts:
    """A staircase with 1 and 8 rows at these costs and 2 and 4 rows in proportion (one row's extra cost each)."""
    row = (eight - one) / 7
    return StepCosts(small={1: one, 2: one + row, 4: one + 3 * row, 8: eight}, passes=passes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=500)
    ap.add_argument("--new", type=int, default=160)
    ap.add_argument("--spec-tokens", type=int, default=8)
    ap.add_argument("--mode", choices=("ngram", "suffix"), default="ngram")
    a = ap.parse_args()
    b = boot("qwen2.5-coder-0.5b", sched=SchedOptions.resolve(env=False), scheduler=False, show=False)
    prompts = edit_prompts(b.tokenizer)
    sched = NativeScheduler(b.model, tokenizer=b.tokenizer, eos_ids=(), warm=False, speculative="off")
    try:
        outs = run(sched, prompts, a.new)[0]
    finally:
        sched.close()
    host = measure(b.model, context=a.context)
    one = host(1)
    stairs = {"this host": host, "Zen 4 (ZEN4_QWEN)": ZEN4_QWEN}
    for f in (3.0, 2.5, 2.0):
        stairs[f"8 rows = {f:.1f}x one"] = scaled(one, f * one, host.passes)
    print(f"bench/spec_bound.py: qwen2.5-coder-0.5b, the {len(prompts)} edit prompts of bench/spec.py, "
          f"{a.new} greedy tokens each, replayed one lane at a time, drafts {a.mode}")
    print(f"this host's steps at {a.context} tokens of context (ms): "
          + ", ".join(f"{r} rows {host(r):.1f}" for r in (1, 2, 4, 8)))
    print(f"{'staircase':<22} {'8 rows / 1':>10} {'choose':>8} {'exact':>8} {'tokens a drafting step':>23}")
    for name, c in stairs.items():
        got, per_step = replay(prompts, outs, c, a.mode, False, a.spec_tokens)
        best, _ = replay(prompts, outs, c, a.mode, True, a.spec_tokens)
        print(f"{name:<22} {c(8) / c(1):>9.2f}x {got:>7.2f}x {best:>7.2f}x {per_step:>23.2f}")


if __name__ == "__main__":
    main()
