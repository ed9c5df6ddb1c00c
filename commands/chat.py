"""`fak chat`: talk to a model in the terminal (fak/chat), tools under the kernel with --tools."""

from __future__ import annotations

import os
import sys

import typer

SANDBOX = {"auto": None, "on": True, "off": False}  # --sandbox -> SandboxTools(os_sandbox=...)


def register(app: typer.Typer) -> None:
    @app.command("chat")
    def chat(
        gguf: str | None = typer.Option(None, "--gguf", help="GGUF path or alias (default qwen2.5-coder-0.5b)."),
        system: str | None = typer.Option(None, "--system", help="System prompt."),
        tools: bool = typer.Option(False, "--tools", help="Let the model call Read, Glob, Grep, Write, Edit and Bash "
                                   "in the current directory, each call judged by the kernel."),
        policy: str | None = typer.Option(None, "--policy", help="Policy JSON for the tool calls (default: the coding floor)."),
        journal: str | None = typer.Option(None, "--journal", help="Append every tool decision to this hash-chained JSONL."),
        base_url: str | None = typer.Option(None, "--base-url", help="Chat through this OpenAI-compatible server "
                                               "instead of the in-kernel model."),
        temperature: float = typer.Option(0.7, "--temp", help="Sampling temperature (0: greedy)."),
        max_tokens: int = typer.Option(1024, "--max-tokens", help="Longest reply, in tokens (per model call)."),
        plain: bool = typer.Option(False, "--plain", help="float32 weights (in-kernel)."),
        sandbox: str = typer.Option("auto", "--sandbox", help="With --tools: run Bash inside a bubblewrap sandbox (the "
                                    "directory writable, the rest read-only, credential stores hidden, no network): "
                                    "auto (when bwrap is installed) | on | off."),
    ) -> None:
        """Chat with a model: streamed replies, multi-turn with the KV cache reused, slash commands (/help)."""
        from fak.chat import backend as backends
        from fak.chat.conversation import Conversation
        from fak.chat.repl import Chat, PlainView, RichView, run
        from fak.errors import FakError

        if gguf and base_url:
            raise FakError("fak chat: --gguf and --base-url exclude each other")
        if max_tokens < 1:
            raise FakError(f"--max-tokens {max_tokens}: expected a positive integer")
        if not 0.0 <= temperature <= 2.0:
            raise FakError(f"--temp {temperature}: expected a number from 0 to 2")
        if sandbox not in SANDBOX:
            raise FakError(f"--sandbox {sandbox!r}: expected auto, on or off")
        kernel, specs = (_tool_kernel(policy, journal, SANDBOX[sandbox]) if tools else (None, None))
        tty = sys.stdin.isatty() and sys.stdout.isatty()
        if base_url:
            be = backends.remote(base_url)
        else:
            from engine.gguf.aliases import resolve_model

            model = gguf or "qwen2.5-coder-0.5b"
            if model != "synthetic":
                resolve_model(model)  # a bad model is one line before anything loads
            be = backends.inkernel(model, plain=plain)
        try:
            if tty:
                from rich.console import Console

                view = RichView(Console())
                view.say(f"fak chat · {be.model} · context {be.context or '?'} · /help for commands", "dim")
            else:
                view = PlainView()
            c = Chat(be, Conversation(system, [], temperature, tools, max_tokens), view, kernel, specs)
            run(c, tty)
        finally:
            be.close()
            if kernel is not None and kernel.journal is not None:
                kernel.journal.close()


def _tool_kernel(policy: str | None, journal: str | None, os_sandbox: bool | None) -> tuple[object, list[dict[str, object]]]:
    """The kernel that judges the model's calls and runs the allowed ones in this directory."""
    from fak.core.journal import Journal
    from fak.core.kernel import Kernel
    from fak.core.policy import coding_floor, load_policy
    from fak.tools import TOOL_SPECS, SandboxTools

    k = Kernel.with_policy(load_policy(policy) if policy else coding_floor(),
                           engines={"sandbox": SandboxTools(root=os.getcwd(), os_sandbox=os_sandbox)}, default_engine="sandbox")
    if journal:
        k.journal = Journal(journal)
    return k, list(TOOL_SPECS)
