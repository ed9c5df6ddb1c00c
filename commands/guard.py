"""`fak guard -- AGENT ARGS...`: run a coding agent with every tool call its model proposes judged by
the kernel (fak/guard)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("guard", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                 options_metavar="[OPTIONS] -- AGENT [ARGS]...")
    def guard(
        ctx: typer.Context,
        upstream: str | None = typer.Option(None, "--upstream", help="Provider or OpenAI-compatible server the "
                                               "agent's requests go to (default: the provider's public API, or the "
                                               "agent's ANTHROPIC_BASE_URL / OPENAI_BASE_URL)."),
        gguf: str | None = typer.Option(None, "--gguf", help="Answer with the in-kernel model instead (no network)."),
        provider: str | None = typer.Option(None, "--provider", help="anthropic | openai | responses (default: "
                                               "from the agent's name: claude -> anthropic, codex -> responses, "
                                               "aider/opencode -> openai, else anthropic)."),
        policy: str | None = typer.Option(None, "--policy", help="Policy JSON (default: the coding floor)."),
        journal: str | None = typer.Option(None, "--journal", help="Journal file (default .fak/guard/<time>-<pid>.jsonl)."),
        no_journal: bool = typer.Option(False, "--no-journal", help="Keep no journal."),
        env: list[str] = typer.Option([], "--env", help="Also set this variable to the gateway's URL in the agent's "
                                      "environment (repeat)."),
        quiet: bool = typer.Option(False, "--quiet", help="No banner and no summary."),
        json_summary: bool = typer.Option(False, "--json", help="The summary as one JSON line on stderr."),
        plain: bool = typer.Option(False, "--plain", help="With --gguf: float32 weights."),
        sandbox: str = typer.Option("on", "--sandbox", help="on: run the agent inside a bubblewrap sandbox (the "
                                    "project writable, the rest read-only, credential stores hidden, no network but "
                                    "the gateway and --allow-net hosts); off: run it as it is."),
        allow_net: list[str] = typer.Option([], "--allow-net", metavar="HOST", help="With --sandbox on: let the agent "
                                            "reach HOST (HOST:PORT, *.DOMAIN) through the guard's proxy (repeat)."),
    ) -> None:
        """Run AGENT (after --) against a private gateway that adjudicates every tool call it is offered."""
        from fak.errors import FakError
        from fak.gateway.local import LocalServer
        from fak.guard import agents, child
        from fak.guard.proxy import HEALTH
        from fak.guard.state import Guard
        from fak.guard.summary import banner_line, show

        argv = list(ctx.args)
        if not argv:
            raise FakError("fak guard: expected the agent's command after --, e.g. fak guard -- claude")
        if upstream and gguf:
            raise FakError("fak guard: --upstream and --gguf exclude each other (a provider, or the in-kernel model)")
        if journal and no_journal:
            raise FakError("fak guard: --journal and --no-journal exclude each other")
        for name in env:
            if not name.isidentifier():
                raise FakError(f"--env {name!r}: expected an environment variable name")
        if sandbox not in ("on", "off"):
            raise FakError(f"--sandbox {sandbox!r}: expected on or off")
        if allow_net and sandbox == "off":
            raise FakError("--allow-net needs --sandbox on (without the sandbox the agent reaches every host)")
        import shutil

        if sandbox == "on":
            from fak.sandbox import check_project, require_bwrap
            from fak.sandbox.proxy import AllowList

            require_bwrap("fak guard")  # one line each, before anything starts
            check_project(os.getcwd(), "fak guard")
            AllowList(allow_net)

        if shutil.which(argv[0]) is None:
            raise FakError(f"{argv[0]}: command not found")
        prov = agents.provider_for(argv, provider)
        kernel = _kernel(policy)
        jpath = None if no_journal else journal or str(
            Path(".fak/guard") / f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.jsonl")
        if jpath:
            from fak.core.journal import Journal

            Path(jpath).parent.mkdir(parents=True, exist_ok=True)
            kernel.journal = Journal(jpath)
        g = Guard(kernel)
        child.block_signals()  # before any thread: signals go to the forwarding thread only
        failed: list[str] = []
        if gguf:
            from engine.gguf.aliases import resolve_model
            from fak.guard.proxy import inkernel_app
            from fak.runtime.boot import boot_for_text

            resolve_model(gguf)  # a bad model is one line before anything starts

            def _boot() -> object:
                return boot_for_text(gguf, "fak guard", resident=not plain)

            app = inkernel_app(_boot, os.path.basename(gguf), g, on_boot_error=failed.append)
            target = f"in-kernel {gguf}"
        else:
            from fak.guard.proxy import proxy_app

            up = upstream or agents.default_upstream(prov, dict(os.environ))
            if not up.startswith(("http://", "https://")):
                raise FakError(f"--upstream {up!r}: expected an http:// or https:// URL")
            app = proxy_app(up, g)
            target = up
        inner = getattr(app, "app", None)  # the app behind AdmitResults (in-kernel: it holds the booted model)
        box, gw = None, None
        try:
            if sandbox == "on":
                from fak.sandbox import Session

                box = Session(allow_net, who="fak guard")  # the allow-list proxy listening on its socket
            gw = LocalServer(app, HEALTH, unix=str(box.gateway_socket) if box is not None else None)
            launch = agents.launch(argv, prov, gw.url, dict(os.environ), extra_vars=env, local_model=bool(gguf),
                                   sandboxed=box is not None)
            if box is not None:
                home = launch.env.get("HOME") or os.path.expanduser("~")
                box.configure(os.getcwd(), home, gateway_port=gw.sock.getsockname()[1],
                              writable=agents.state_paths(argv, launch.env), tmpdir=launch.env.get("TMPDIR"),
                              readonly=(Path(jpath),) if jpath else (),  # the journal is not the agent's
                              interactive=sys.stdin.isatty(), programs=tuple(launch.argv),
                              path=launch.env.get("PATH"))
            gw.start(failed=lambda: failed[0].removeprefix("boot failed: ") if failed else None,
                     ready=(lambda: inner.state.booted is not None) if gguf else None)
            if not quiet:
                from fak.guard.wires import anthropic, chat, responses

                wire = {"anthropic": anthropic, "openai": chat, "responses": responses}[prov].NAME
                policy_name = getattr(kernel.chain[0], "name", "policy")
                sys.stderr.write(f"fak guard: {os.path.basename(argv[0])} · {wire} via {gw.url} → {target} · policy "
                                 f"{policy_name} · journal {jpath or 'off'}\n")
                sys.stderr.write(banner_line(box.report() if box is not None else None, launch.env.get("HOME")) + "\n")
                sys.stderr.flush()
            rc = child.run(launch.argv, launch.env, box)
        finally:
            if gw is not None:
                gw.stop()
            report = box.report() if box is not None else None
            if box is not None:
                box.close()
            b = getattr(getattr(inner, "state", None), "booted", None)
            if b is not None:
                b.close()
            if kernel.journal is not None:
                kernel.journal.close()
        if not quiet:
            show(g.tally, agent=os.path.basename(argv[0]), exit_code=rc, journal=jpath, json_line=json_summary,
                 sandbox=report, home=launch.env.get("HOME"))
        raise typer.Exit(rc)


def _kernel(policy: str | None) -> object:
    from fak.core.kernel import Kernel
    from fak.core.policy import coding_floor, load_policy

    return Kernel.with_policy(load_policy(policy) if policy else coding_floor())
