"""`fak run`: replay a trace through the kernel (--trace) or generate with a model (MODEL [PROMPT])."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        model: Optional[str] = typer.Argument(None, help="GGUF path or alias (gemma3-270m); default $FAK_MODEL."),
        prompt: Optional[str] = typer.Argument(None, help="Prompt text; omit for a REPL."),
        trace: Optional[Path] = typer.Option(None, "--trace", help="Replay a JSON trace of tool calls through the kernel."),
        engine: Optional[str] = typer.Option(None, "--engine", help="Engine id for --trace (mock, http, inkernel)."),
        policy: Optional[Path] = typer.Option(None, "--policy", help="Policy JSON for --trace."),
        journal: Optional[Path] = typer.Option(None, "--journal", help="Append decisions to this hash-chained JSONL."),
        gguf: Optional[str] = typer.Option(None, "--gguf", help="Preload this model for the inkernel engine (--trace)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table / stream."),
        max_tokens: int = typer.Option(128, "--max-tokens", help="Tokens to generate."),
        temp: float = typer.Option(0.0, "--temp", help="Sampling temperature (0 = greedy)."),
        top_k: int = typer.Option(0, "--top-k", help="Top-k (0 = off)."),
        top_p: float = typer.Option(1.0, "--top-p", help="Top-p (1 = off)."),
        seed: Optional[int] = typer.Option(None, "--seed", help="Sampling seed."),
        system: Optional[str] = typer.Option(None, "--system", help="System prompt (chat template)."),
        ids: Optional[str] = typer.Option(None, "--ids", help="Comma-separated prompt token ids instead of PROMPT."),
        q4k: bool = typer.Option(False, "--q4k", help="Keep quantized weights resident (no float32 copy)."),
    ) -> None:
        """Replay a trace through the kernel, or run a model on a prompt."""
        if trace is not None:
            from commands.run_trace import run_trace

            run_trace(trace, engine=engine, policy=policy, journal=journal, gguf=gguf, q4k=q4k, as_json=as_json)
            return
        from commands.run_model import run_model

        run_model(
            model, prompt, max_tokens=max_tokens, temp=temp, top_k=top_k, top_p=top_p, seed=seed,
            system=system, ids=ids, q4k=q4k, as_json=as_json,
        )
