"""`fak agent --task NAME|FILE`: one task run twice, with the kernel (every call adjudicated, every
result admitted) and without it (the tools run directly), each in a fresh sandbox; a side-by-side report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

DEFAULT_MODEL = "qwen2.5-coder-0.5b"


def register(app: typer.Typer) -> None:
    @app.command("agent")
    def agent(
        task: str = typer.Option(..., "--task", help="A shipped task (examples/tasks/NAME.json) or a task file."),
        offline: bool = typer.Option(False, "--offline", help="The task's scripted planner proposes (no model)."),
        gguf: str | None = typer.Option(None, "--gguf", help=f"In-kernel model that plans (default {DEFAULT_MODEL})."),
        base_url: str | None = typer.Option(None, "--base-url", help="Plan with any OpenAI-compatible server instead."),
        model: str | None = typer.Option(None, "--model", help="With --base-url: the model name (default: its first)."),
        max_turns: int | None = typer.Option(None, "--max-turns", min=1,
                                             help="Planner turns per arm (default: the task's, else 12)."),
        out: str | None = typer.Option(None, "--out", help="Write the report as JSON to this file."),
        policy: str | None = typer.Option(None, "--policy", help="Policy JSON of the fak arm (default: the coding floor)."),
        journal: str | None = typer.Option(None, "--journal", help="Journal the fak arm's decisions to this file."),
        temperature: float = typer.Option(0.0, "--temp", min=0.0, help="Model sampling temperature."),
        max_tokens: int = typer.Option(512, "--max-tokens", min=1, help="Model tokens per turn."),
        bash_timeout: float = typer.Option(30.0, "--bash-timeout", min=0.1, help="Seconds before a Bash call is killed."),
        keep: bool = typer.Option(False, "--keep", help="Keep both sandboxes (their paths are in the report)."),
        quiet: bool = typer.Option(False, "--quiet", help="No table on stdout (with --out)."),
        sandbox: str = typer.Option("auto", "--sandbox", help="Run both arms' Bash inside a bubblewrap sandbox (the "
                                    "task's directory writable, the rest read-only, credential stores hidden, no "
                                    "network): auto (when bwrap is installed) | on | off."),
    ) -> None:
        """Run a task with and without the kernel and report the difference."""
        from fak.agent import load_task, run_ab
        from fak.agent.planner import ScriptedPlanner
        from fak.agent.report import ab_table, calls_table, report_json
        from fak.core.policy import coding_floor, load_policy
        from fak.errors import FakError

        if offline and (gguf or base_url or model):
            raise FakError("fak agent: --offline plans without a model; drop --gguf / --base-url / --model")
        if gguf and base_url:
            raise FakError("fak agent: --gguf and --base-url exclude each other (the in-kernel model, or a server)")
        if model and not base_url:
            raise FakError("fak agent: --model names a --base-url server's model (the in-kernel one is --gguf)")
        os_sandbox = {"auto": None, "on": True, "off": False}.get(sandbox, "bad")
        if os_sandbox == "bad":
            raise FakError(f"--sandbox {sandbox!r}: expected auto, on or off")
        if os_sandbox:
            from fak.sandbox import require_bwrap

            require_bwrap("fak agent")
        t = load_task(task)
        pol = load_policy(policy) if policy else coding_floor()
        jr = None
        if journal:
            from fak.core.journal import Journal

            jr = Journal(journal)
        turns = max_turns or t.max_turns or 12
        server: Any = None
        try:
            if offline:
                if t.plan is None:
                    raise FakError(f"{t.source}: plan: missing (--offline needs a scripted plan)")
                steps = t.plan
                planner_name = "scripted"

                def make() -> Any:
                    return ScriptedPlanner(steps, t.instructions)
            else:
                from fak.agent.model import ModelPlanner, client_for, first_model
                from fak.gateway.local import InKernelServer
                from fak.tools import specs_for

                if base_url:
                    if not base_url.startswith(("http://", "https://")):
                        raise FakError(f"--base-url {base_url!r}: expected an http:// or https:// URL")
                    client = client_for(base_url)
                    name = model or first_model(client)
                else:
                    from engine.gguf.aliases import resolve_model

                    resolve_model(gguf or DEFAULT_MODEL)  # a bad model is one line before anything starts
                    server = InKernelServer(gguf or DEFAULT_MODEL, who="fak agent")
                    server.start()
                    client, name = client_for(server.url), server.model
                specs = specs_for(t.tools)
                planner_name = f"model:{name}"

                def make() -> Any:
                    return ModelPlanner(client, name, t.instructions, specs, temperature, max_tokens)

                make().warm()

            fak_rep, base_rep = run_ab(t, make, policy=pol, max_turns=turns, bash_timeout=bash_timeout, journal=jr,
                                       keep=keep, os_sandbox=os_sandbox)
        finally:
            if server is not None:
                server.stop()
            if jr is not None:
                jr.close()
        doc = report_json(t.name, planner_name, pol.name, fak_rep, base_rep)
        if out:
            try:
                Path(out).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
            except OSError as exc:
                raise FakError(f"{out}: cannot write the report: {exc.strerror or exc}") from None
        if not quiet:
            from rich.console import Console

            con = Console(highlight=False)
            con.print(ab_table(fak_rep, base_rep, f"{t.name} · {planner_name} · policy {pol.name}"))
            for rep in (fak_rep, base_rep):
                con.print(calls_table(rep))
