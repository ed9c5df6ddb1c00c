"""`fak run`: replay a trace through the kernel (--trace) or generate with a model (MODEL [PROMPT])."""

from __future__ import annotations

from pathlib import Path

import typer

from commands import sched_flags


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        model: str | None = typer.Argument(None, help="GGUF path or alias (gemma3-270m); default $FAK_MODEL."),
        prompt: str | None = typer.Argument(None, help="Prompt text; omit for a REPL."),
        trace: Path | None = typer.Option(None, "--trace", help="Replay a JSON trace of tool calls through the kernel."),
        engine: str | None = typer.Option(None, "--engine", help="Engine id for --trace (mock, http, inkernel)."),
        policy: Path | None = typer.Option(None, "--policy", help="Policy JSON for --trace."),
        journal: Path | None = typer.Option(None, "--journal", help="Append decisions to this hash-chained JSONL."),
        gguf: str | None = typer.Option(None, "--gguf", help="GGUF path or alias: the model to run (same as MODEL), "
                                                             "or the inkernel engine's for --trace."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table / stream."),
        max_tokens: int = typer.Option(128, "--max-tokens", help="Tokens to generate."),
        temp: float = typer.Option(0.0, "--temp", help="Sampling temperature (0 = greedy)."),
        top_k: int = typer.Option(0, "--top-k", help="Top-k (0 = off)."),
        top_p: float = typer.Option(1.0, "--top-p", help="Top-p (1 = off)."),
        seed: int | None = typer.Option(None, "--seed", help="Sampling seed."),
        system: str | None = typer.Option(None, "--system", help="System prompt (chat template)."),
        ids: str | None = typer.Option(None, "--ids", help="Comma-separated prompt token ids instead of PROMPT."),
        chat: bool = typer.Option(False, "--chat", help="Wrap the prompt in a chat template even if the GGUF has none."),
        raw: bool = typer.Option(False, "--raw", help="Raw completion (BOS + text) even if the GGUF has a chat template."),
        plain: bool = typer.Option(False, "--plain",
                                   help="Dequantize every weight to float32 (default: keep quantized blocks resident)."),
        q4k: bool = typer.Option(False, "--q4k", help="Keep quantized weights resident: the default, kept as an alias."),
        max_running: int | None = sched_flags.MAX_RUNNING,
        kv_blocks: int | None = sched_flags.KV_BLOCKS,
        block_tokens: int | None = sched_flags.BLOCK_TOKENS,
        preempt: str | None = sched_flags.PREEMPT,
        victim: str | None = sched_flags.VICTIM,
        prefix_cache_gib: float | None = sched_flags.PREFIX_CACHE_GIB,
        kv_cache_dir: str | None = sched_flags.KV_CACHE_DIR,
        no_kv_cache_dir: bool = sched_flags.NO_KV_CACHE_DIR,
        kv_cache_disk_gib: float | None = sched_flags.KV_CACHE_DISK_GIB,
        kv_dtype: str | None = sched_flags.KV_DTYPE,
        speculative: str | None = sched_flags.SPECULATIVE,
        spec_tokens: int | None = sched_flags.SPEC_TOKENS,
    ) -> None:
        """Replay a trace through the kernel, or run a model on a prompt."""
        from fak.errors import FakError
        from fak.runtime.boot import SchedOptions

        if plain and q4k:
            raise FakError("--plain and --q4k contradict each other: resident (--q4k) is the default")
        flags = {"max_running": max_running, "kv_blocks": kv_blocks, "block_tokens": block_tokens,
                 "preempt": preempt, "victim": victim,
                 **sched_flags.cache_flags(prefix_cache_gib, kv_cache_dir, no_kv_cache_dir, kv_cache_disk_gib, kv_dtype),
                 **sched_flags.spec_flags(speculative, spec_tokens)}
        if trace is not None:
            from commands.run_trace import run_trace

            SchedOptions.resolve(env=False, **flags)  # a bad flag is one line before anything loads
            given = {k: v for k, v in flags.items() if v is not None}  # the engine reads FAK_* for the rest
            run_trace(trace, engine=engine, policy=policy, journal=journal, gguf=gguf, resident=not plain,
                      sched=given, as_json=as_json)
            return
        from commands.run_model import run_model

        if gguf is not None:  # `fak run --gguf MODEL [PROMPT]`: the one positional is the prompt
            if prompt is not None:
                raise FakError(f"--gguf {gguf}: give the model once (--gguf MODEL PROMPT or MODEL PROMPT)")
            model, prompt = gguf, model
        run_model(
            model, prompt, max_tokens=max_tokens, temp=temp, top_k=top_k, top_p=top_p, seed=seed,
            system=system, ids=ids, chat=chat, raw=raw, resident=not plain, sched=SchedOptions.resolve(**flags),
            as_json=as_json,
        )

