"""Speculative decoding, side by side in one run: --speculative off vs ngram vs suffix.

    python bench/spec.py [--lanes 1,16] [--new 160] [--workloads edit,plain] [--spec-tokens K] [--rounds 3]
                         [--preamble WORDS] [--waves W]

Workloads (the outputs of every mode are asserted equal to speculation off's):
  edit   Qwen2.5-Coder 0.5B instruct (resident): an 80-line Python file returned with one change, a
         unified diff of a small change to it, and the same tool-call JSON asked for 5 times with
         different arguments;
  plain  Gemma 3 270M base continuing story openings (text that does not repeat), sampled at temperature
         0.8, top-p 0.95, a seed per prompt (greedy, a base model loops on its last sentence).
--waves W (more than one lane): lanes x W requests, LANES in flight, a finished lane taking the next request at
once (a server under that many concurrent clients), each a different prompt: another variant of each edit task
(another name to rename to, another change to diff, another list of paths), a story under another seed.
--preamble puts WORDS words of earlier context before every prompt (random words, seeded: a long agent
session's history that the reply does not copy), so every row attends to thousands of positions.
For each mode and lane count: decode tok/s (tokens after the first / the time between the first and the
last; with 16 lanes the aggregate over every lane, each batch's prompts already in the prefix cache),
acceptance (kept / drafted draft tokens), tokens per drafting lane-step, steps, and the share of the
decode ceiling (stream-read GB/s / weight bytes a step reads) the rate is: past 100% is more than one
token per read of the weights. The modes take turns, round by round in a rotated order, on ONE scheduler
booted as `fak serve` boots it (NativeScheduler.set_speculative between runs; its loop thread is the only
one that runs kernels); the rates are over every round, the ratios against off's, with the spread of the
per-round ratios beside them.
"""

from __future__ import annotations

import argparse
import queue
import sys
import time
from dataclasses import replace

import numpy as np
from decode import bytes_per_token  # bench/decode.py (the script's own directory is on sys.path)

from engine.model.diag import stream_read_gbps
from engine.model.sampling import SamplingParams
from engine.sched.lane import Request
from engine.sched.scheduler import NativeScheduler
from fak.runtime.boot import SchedOptions, boot

MODES = ("off", "ngram", "suffix")


def python_file() -> str:
    """An 80-line module: what an agent asks a model to return with one change."""
    lines = ['"""Inventory records: parse, validate, summarise."""', "", "from __future__ import annotations", "",
             "import csv", "import json", "from dataclasses import dataclass", "from pathlib import Path", "", ""]
    lines += ["@dataclass", "class Item:", "    sku: str", "    name: str", "    quantity: int", "    price: float",
              "", "    def value(self) -> float:", "        return self.quantity * self.price", "", ""]
    for name, field, check in (("parse_quantity", "quantity", "value < 0"), ("parse_price", "price", "value < 0.0")):
        lines += [f"def {name}(raw: str) -> float:", f'    """The {field} column of a row, checked."""',
                  "    value = float(raw.strip())", f"    if {check}:",
                  f'        raise ValueError(f"negative {field}: {{raw!r}}")', "    return value", "", ""]
    lines += ["def parse_line(row: dict[str, str]) -> Item:", '    """One CSV row as an Item."""',
              "    return Item(", '        sku=row["sku"].strip(),', '        name=row["name"].strip(),',
              '        quantity=int(parse_quantity(row["quantity"])),', '        price=parse_price(row["price"]),',
              "    )", "", "",
              "def load(path: Path) -> list[Item]:", '    """Every row of the file, in order."""',
              "    with path.open(newline=\"\") as f:", "        return [parse_line(row) for row in csv.DictReader(f)]",
              "", "",
              "def total_value(items: list[Item]) -> float:", "    return sum(item.value() for item in items)", "", "",
              "def summary(items: list[Item]) -> dict[str, float]:", "    return {",
              '        "items": len(items),', '        "units": sum(item.quantity for item in items),',
              '        "value": round(total_value(items), 2),', "    }", "", "",
              "def main(argv: list[str]) -> int:", "    items = load(Path(argv[1]))",
              "    print(json.dumps(summary(items), indent=2))", "    return 0"]
    return "\n".join(lines) + "\n"


WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community name "
         "river stone garden window letter market engine signal harbour winter copper ladder").split()


def preamble(words: int) -> str:
    """`words` random words (seed 0) in sentences: context a reply attends to and does not repeat."""
    if words <= 0:
        return ""
    rng = np.random.default_rng(0)
    picks = [WORDS[i] for i in rng.integers(0, len(WORDS), size=words)]
    sentences = [" ".join(picks[i:i + 12]).capitalize() + "." for i in range(0, words, 12)]
    return "Notes from earlier in this session: " + " ".join(sentences) + "\n\n"


RENAMES = ["parse_row", "parse_record", "parse_entry", "row_to_item", "read_item", "item_from_row"]
DIFFS = ["makes `total_value` round its result to 2 places", "makes `load` skip rows whose sku is empty",
         "makes `summary` also report the number of items under the key \"count\"",
         "makes `parse_price` reject prices above 1000000", "makes `main` print the summary as JSON",
         "makes `Item.value` return 0 for a negative quantity"]
PATHS = ["src/app.py", "src/models/user.py", "tests/test_app.py", "docs/index.md", "setup.cfg", "src/cli.py",
         "src/models/order.py", "tests/conftest.py", "README.md", "pyproject.toml"]


def edit_prompts(tok, words: int = 0, variants: int = 1) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """The three edit tasks, `variants` times over (variant v: another name to rename to, another change to
    diff, the paths list turned by v), interleaved: task i % 3 of variant i // 3."""
    src = python_file()
    out = []
    for v in range(variants):
        paths = ", ".join((PATHS[v % len(PATHS):] + PATHS[:v % len(PATHS)])[:5])
        tasks = [
            f"Here is a file:\n```python\n{src}```\nRename the function `parse_line` to `{RENAMES[v % len(RENAMES)]}` "
            "everywhere. Return the whole file in one ```python block and nothing else.",
            f"Here is `inventory.py`:\n```python\n{src}```\nWrite a unified diff (--- a/inventory.py, +++ "
            f"b/inventory.py) that {DIFFS[v % len(DIFFS)]}. Reply with the diff only.",
            "Call the tool read_file once for each of these paths, one JSON object per line, each exactly "
            '{"name": "read_file", "arguments": {"path": "<path>", "encoding": "utf-8"}}: ' + paths,
        ]
        for t in tasks:
            text = tok.apply_chat_template([{"role": "user", "content": preamble(words) + t}],
                                           add_generation_prompt=True)
            out.append(list(tok.encode(text)))
    return out


STORIES = [
    "The lighthouse keeper had not spoken to another person in eleven years when the boat appeared",
    "My grandmother kept a jar of buttons on the kitchen windowsill, and every button had a story",
    "The train stopped in the middle of the desert, and the conductor walked through the carriages",
    "Nobody in the village remembered who had planted the orchard on the hill above the river",
    "On the first day of the expedition, the cartographer lost her compass in the snow",
]


def plain_prompts(tok, words: int = 0) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [list(tok.encode(preamble(words) + s)) for s in STORIES]


def sampling_for(workload: str, i: int) -> SamplingParams:
    """Greedy for edits; seeded sampling for the stories (a base model's greedy continuation of a story
    falls into a loop, repeating its last sentence, which is the opposite of text that does not repeat).
    Seeded requests give the same tokens with speculation on or off, so the outputs are still compared."""
    return SamplingParams() if workload == "edit" else SamplingParams(temperature=0.8, top_p=0.95, seed=1000 + i)


def repeated_share(prompts: list[list[int]], outs: list[list[int]], n: int = 4) -> float:
    """The share of output tokens that end an n-gram already seen in their prompt or output: what a lookup
    draft could have proposed."""
    hit = total = 0
    for prompt, out in zip(prompts, outs, strict=True):
        seq = prompt + out
        seen = {tuple(seq[j - n + 1:j + 1]) for j in range(n - 1, len(prompt))}
        for j in range(len(prompt), len(seq)):
            g = tuple(seq[j - n + 1:j + 1])
            hit += g in seen
            total += 1
            seen.add(g)
    return hit / max(1, total)


def run(sched: NativeScheduler, prompts: list[list[int]], new: int, workload: str = "edit",
        first: int = 0) -> tuple[list[list[int]], float, int]:
    """Every prompt at once (prompt i sampled as `sampling_for(workload, first + i)`); (tokens of each, decode
    tok/s aggregated, steps)."""
    steps0 = sched.stats().steps
    hs = [sched.admit(Request(p, max_new_tokens=new, stop_on_eos=False, sampling=sampling_for(workload, first + i)))
          for i, p in enumerate(prompts)]
    return finished(sched, hs, steps0)


def finished(sched: NativeScheduler, hs: list, steps0: int) -> tuple[list[list[int]], float, int]:  # type: ignore[type-arg]
    """(tokens of each handle, decode tok/s aggregated, steps since steps0). Decode time: from the first token
    any lane emitted (prompts are prefix-cache hits by then) to the last."""
    res = [h.result(timeout=3600) for h in hs]
    tokens = sum(len(r.token_ids) - 1 for r in res)
    starts = [h._lane.first_token_at for h in hs]
    ends = [h._lane.token_times[-1] for h in hs]
    return [r.token_ids for r in res], tokens / (max(ends) - min(starts)), sched.stats().steps - steps0


def sustained(sched: NativeScheduler, prompts: list[list[int]], lanes: int, new: int, workload: str
              ) -> tuple[list[list[int]], float, int]:
    """Every prompt, `lanes` of them in flight: a finished request's lane goes to the next prompt at once, as
    a server under that many concurrent clients runs (prompt i sampled as `sampling_for(workload, i)`);
    (tokens of each, decode tok/s aggregated from the first token to the last, steps)."""
    steps0 = sched.stats().steps
    done: queue.SimpleQueue[int] = queue.SimpleQueue()
    hs: list = []  # type: ignore[type-arg]

    def admit(i: int) -> None:
        h = sched.admit(Request(prompts[i], max_new_tokens=new, stop_on_eos=False, sampling=sampling_for(workload, i)))
        told = [False]

        def notify() -> None:  # on the loop thread after each event: the finish is passed on, once
            if h.done and not told[0]:
                told[0] = True
                done.put(i)

        h.watch(notify)
        hs.append(h)

    for i in range(min(lanes, len(prompts))):
        admit(i)
    for _ in range(len(prompts)):
        done.get(timeout=3600)
        if len(hs) < len(prompts):
            admit(len(hs))
    return finished(sched, hs, steps0)


def bench(alias: str, workload: str, lanes_list: list[int], new: int, spec_tokens: int, rounds: int,
          words: int = 0, waves: int = 1) -> None:
    # ONE scheduler, its mode switched between runs (set_speculative), booted as `fak serve` boots it: its
    # loop thread warms the kernels and is the only thread that launches them. A scheduler a mode was a loop
    # thread a mode, each with its own OpenMP team, and on 2 cores a second team made every kernel launch wait
    # for a worker's wake-up (16-lane edit off 163 tok/s with three schedulers, 212 with one)
    opts = replace(SchedOptions.resolve(env=False), speculative="suffix", spec_tokens=spec_tokens, kv_cache_dir="off")
    b = boot(alias, sched=opts, show=False)
    model, tok, sched = b.model, b.tokenizer, b.scheduler
    prompts = edit_prompts(tok, words) if workload == "edit" else plain_prompts(tok, words)
    # with --waves: every lane count's requests are different prompts (another variant of each edit task, a
    # story under another seed), so no request is drafted from a remembered identical answer
    many = (edit_prompts(tok, words, -(-max(lanes_list) * waves // 3)) if workload == "edit"
            else plain_prompts(tok, words) * -(-max(lanes_list) * waves // len(STORIES)))
    per_token = bytes_per_token(model)
    print(f"\n{workload}: {alias}, {len(prompts)} prompts ({', '.join(str(len(p)) for p in prompts)} tokens), "
          f"{new} new tokens each, weights read per step {per_token / 1e6:.0f} MB")
    for lanes in lanes_list:
        batch = [prompts[i % len(prompts)] for i in range(lanes)] if lanes > 1 else None
        if batch is not None and waves > 1:
            batch = many[:lanes * waves]
        run(sched, prompts if batch is None else list({tuple(p): p for p in batch}.values()), 2)  # prompts cached
        bw = sched.call(lambda: stream_read_gbps(256 << 20, 3)).result()  # on the thread that runs the kernels
        ceiling = bw * 1e9 / per_token
        c = sched.step_costs  # timed at warm-up: what each step's choice of draft rows is priced on
        print(f"  step costs (warm-up, ms): 8 rows {c.small[8]:.1f}, 16 {c(16):.1f}, 32 {c(32):.1f}, 64 {c(64):.1f}; "
              f"a lane {c.lane:.2f}, a row per 1000 positions {c.attention:.2f}, a lane's first row {c.first:.2f}")
        # the modes take turns, round by round, in a rotated order: this shared host's speed drifts by
        # 10-20% over a minute, and a mode measured only first (or only last) would carry that drift
        toks: dict[str, float] = dict.fromkeys(MODES, 0.0)
        secs: dict[str, float] = dict.fromkeys(MODES, 0.0)
        steps: dict[str, int] = dict.fromkeys(MODES, 0)
        counts: dict[str, np.ndarray] = {m: np.zeros(4) for m in MODES}  # drafted, accepted, lane steps, emitted
        ratios: dict[str, list[float]] = {m: [] for m in MODES}
        ref: list[list[int]] | None = None
        for r in range(rounds):
            order = MODES[r % len(MODES):] + MODES[: r % len(MODES)]
            this: dict[str, float] = {}
            for m in order:
                # a fresh drafter each run: suffix's memory of earlier outputs starts afresh, as a round repeats
                # the last one's requests word for word, and drafting a whole answer remembered from it is not
                # the workload
                sched.set_speculative(m, spec_tokens)
                st0 = sched.stats()
                if batch is None:  # single stream: each prompt alone, rates over the whole set
                    outs, t, n_tok, n_steps = [], 0.0, 0, 0
                    for i, p in enumerate(prompts):
                        o, rate, n = run(sched, [p], new, workload, i)
                        outs += o
                        t += (len(o[0]) - 1) / rate
                        n_tok += len(o[0]) - 1
                        n_steps += n
                else:
                    outs, rate, n_steps = (sustained(sched, batch, lanes, new, workload) if waves > 1
                                           else run(sched, batch, new, workload))
                    n_tok = sum(len(o) - 1 for o in outs)
                    t = n_tok / rate
                st = sched.stats()
                counts[m] += [st.spec_drafted - st0.spec_drafted, st.spec_accepted - st0.spec_accepted,
                              st.spec_lane_steps - st0.spec_lane_steps, st.spec_emitted - st0.spec_emitted]
                if ref is None:
                    ref = outs
                elif outs != ref:
                    bad = next(i for i, (a, c) in enumerate(zip(outs, ref, strict=True)) if a != c)
                    sys.exit(f"bench/spec.py: {m} changed the greedy output of prompt {bad} ({workload}, {lanes} lanes)")
                toks[m] += n_tok
                secs[m] += t
                steps[m] += n_steps
                this[m] = n_tok / t
            for m in MODES:
                ratios[m].append(this[m] / this["off"])
        base = toks["off"] / secs["off"]
        assert ref is not None
        rep = repeated_share(batch or prompts, ref)
        print(f"  {lanes} lane{'s' if lanes > 1 else ''} (ceiling {ceiling:.1f} tok/s a lane at {bw:.1f} GB/s), "
              f"{rounds} round{'s' if rounds > 1 else ''}, {rep:.0%} of output tokens end a 4-gram seen before:")
        for m in MODES:
            drafted, accepted, lsteps, emitted = counts[m]
            rate = toks[m] / secs[m]
            acc = f"{accepted / drafted:5.1%}" if drafted else "   - "
            tps = f"{emitted / lsteps:4.2f}" if lsteps else "  - "
            share = rate / lanes / ceiling if batch is not None else rate / ceiling
            spread = f"{min(ratios[m]):.2f}-{max(ratios[m]):.2f}" if rounds > 1 else ""
            print(f"    {m:7s} {rate:7.1f} tok/s  {rate / base:5.2f}x {spread:>9s}  acceptance {acc}  "
                  f"tokens/drafting step {tps}  steps {steps[m] // rounds:5d}  {share:6.1%} of the ceiling"
                  f"{' a lane' if batch is not None else ''}")
    sched.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lanes", default="1,16")
    ap.add_argument("--new", type=int, default=160)
    ap.add_argument("--workloads", default="edit,plain")
    ap.add_argument("--spec-tokens", type=int, default=SchedOptions.spec_tokens)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every mode, in turns (rates over all of them)")
    ap.add_argument("--preamble", type=int, default=0, help="words of earlier context before every prompt")
    ap.add_argument("--waves", type=int, default=1, help="with more than one lane: lanes x WAVES requests, LANES of "
                    "them in flight (a finished lane takes the next at once), every one a different prompt")
    a = ap.parse_args()
    if a.preamble < 0:
        ap.error(f"--preamble: words of earlier context must be 0 or more, not {a.preamble}")
    if a.waves < 1:
        ap.error(f"--waves: requests per lane must be 1 or more, not {a.waves}")
    lanes = [int(x) for x in a.lanes.split(",")]
    print(f"bench/spec.py: {time.strftime('%Y-%m-%d %H:%M')}, lanes {lanes}, --spec-tokens {a.spec_tokens}, "
          f"--preamble {a.preamble}, --waves {a.waves}, edit greedy, plain sampled with a seed a prompt, outputs asserted equal")
    np.random.seed(0)
    for w in a.workloads.split(","):
        bench("qwen2.5-coder-0.5b" if w == "edit" else "gemma3-270m", w, lanes, a.new, a.spec_tokens, a.rounds,
              a.preamble, a.waves)


if __name__ == "__main__":
    main()
