"""The scheduler flags every model-using subcommand takes (resolved by fak.runtime.boot.SchedOptions)."""

from __future__ import annotations

import typer

# typer reads these as the parameters' defaults; one definition, so every subcommand spells them alike
MAX_RUNNING = typer.Option(None, "--max-running", help="Scheduler: running lanes cap, 0 = unbounded [FAK_MAX_RUNNING].")
KV_BLOCKS = typer.Option(None, "--kv-blocks", help="Scheduler: KV budget in blocks (default growable) [FAK_KV_BLOCKS].")
BLOCK_TOKENS = typer.Option(None, "--block-tokens", help="Scheduler: tokens per KV block (16) [FAK_BLOCK_TOKENS].")
PREEMPT = typer.Option(None, "--preempt", help="Scheduler: swap | recompute [FAK_PREEMPT].")
VICTIM = typer.Option(None, "--victim", help="Scheduler: most-recent | cost-aware [FAK_VICTIM].")
