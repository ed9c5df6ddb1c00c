"""The `fak` CLI: one typer app, one module per subcommand."""

from __future__ import annotations

import sys

if len(sys.argv) > 1 and sys.argv[1] == "guard":
    # fak guard takes the signals it forwards with sigwaitinfo, so every thread must block them, and
    # a thread started before the block (numpy's BLAS pool, at the first import below) would not:
    # a kill -INT landing there killed fak instead of reaching the agent
    from fak.guard.child import block_signals

    block_signals()

import typer  # noqa: E402

from engine.errors import EngineError  # noqa: E402
from fak import __version__  # noqa: E402
from fak.errors import FakError  # noqa: E402

try:  # typer >= 0.2x carries its own copy of click
    from typer._click import exceptions as cx
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as cx  # type: ignore[no-redef]

app = typer.Typer(
    name="fak",
    help="fak: a fused agent kernel. Every tool call is adjudicated, journaled, then dispatched.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"fak {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """fak: a fused agent kernel."""


def _register() -> None:
    # Imported here so `fak --help` stays cheap and each module owns its flags.
    from commands import agent, audit, chat, doctor, guard, q4kdiag, run, serve, top, worker

    for mod in (run, agent, serve, guard, q4kdiag, chat, top, worker, doctor):
        mod.register(app)
    app.add_typer(audit.app, name="audit")


def main() -> None:
    _register()
    try:
        rc = app(prog_name="fak", standalone_mode=False)
    except (FakError, EngineError) as exc:
        print(f"fak: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except cx.NoArgsIsHelpError as exc:  # `fak`, `fak audit`: the help, as before
        typer.echo(exc.ctx.get_help() if exc.ctx is not None else str(exc))
        sys.exit(2)
    except cx.ClickException as exc:  # a bad flag value, a missing argument: one line too
        where = exc.ctx.command_path if getattr(exc, "ctx", None) is not None else "fak"  # type: ignore[attr-defined]
        print(f"fak: error: {where}: {exc.format_message()}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
