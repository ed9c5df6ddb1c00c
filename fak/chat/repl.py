"""The chat loop: a line editor on a terminal (prompt_toolkit: history kept in the user's cache dir,
Esc-Enter for a new line, Ctrl-C cancels a reply in flight or clears the line, Ctrl-D exits), piped
lines as turns otherwise; slash commands; replies streamed, then rendered as markdown on a terminal."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fak.chat.backend import Backend
from fak.chat.conversation import Conversation
from fak.chat.turn import CallShown, View, args_preview, turn
from fak.errors import FakError

HELP = """/help              this list
/system TEXT       set the system prompt (/system alone clears it)
/reset             forget the conversation
/save FILE         write the transcript (JSON)
/load FILE         read a transcript written by /save
/stats             the engine: lanes, KV blocks, prefix hits, preemptions
/tools on|off      let the model call Read, Glob, Grep, Write, Edit, Bash in this directory
/temp X            sampling temperature (0 = greedy)
/model             what is loaded
/exit              leave (Ctrl-D too)
Esc-Enter: a new line in the message. Ctrl-C: stop the reply in flight."""


def history_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fak" / "chat_history"


class RichView(View):
    """A terminal: the reply streams live, then is drawn again as markdown; calls with their verdict."""

    def __init__(self, console: Any) -> None:
        self.con = console
        self.live: Any = None
        self.buf = ""

    def text(self, piece: str) -> None:
        from rich.live import Live
        from rich.markdown import Markdown

        self.buf += piece
        if self.live is None:
            self.live = Live(Markdown(self.buf), console=self.con, refresh_per_second=8, transient=False)
            self.live.start()
        self.live.update(Markdown(self.buf))

    def end_reply(self, text: str) -> None:
        if self.live is not None:
            self.live.stop()
        self.live, self.buf = None, ""

    def abort(self) -> None:
        self.end_reply("")

    def call(self, shown: CallShown) -> None:
        ok = shown.verdict in ("ALLOW", "TRANSFORM")
        style = "green" if ok else "bold red"
        why = f" {shown.reason}" + (f" ({shown.detail})" if shown.detail else "") if not ok or shown.verdict != "ALLOW" else ""
        self.con.print(f"[{style}]{'⚙' if ok else '✗'} {shown.name}[/] {args_preview(shown.arguments)} "
                       f"[{style}]→ {shown.verdict}{why}[/]", highlight=False, markup=True)
        if ok:
            first = shown.result.strip().splitlines()[:3]
            for line in first:
                self.con.print(f"  [dim]{line[:160]}[/]", highlight=False)

    def status(self, line: str) -> None:
        self.con.print(f"[dim]{line}[/]", highlight=False)

    def say(self, line: str, style: str = "") -> None:
        self.con.print(f"[{style}]{line}[/]" if style else line, highlight=False, markup=bool(style))


class PlainView(View):
    """Piped: the reply as plain text on stdout; calls and the status line on stderr."""

    def text(self, piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    def end_reply(self, text: str) -> None:
        if text:
            sys.stdout.write("\n")
            sys.stdout.flush()

    def abort(self) -> None:
        sys.stdout.write("\n")

    def call(self, shown: CallShown) -> None:
        why = f" {shown.reason}" + (f" ({shown.detail})" if shown.detail else "") if shown.verdict != "ALLOW" else ""
        sys.stderr.write(f"tool {shown.name} {args_preview(shown.arguments)} -> {shown.verdict}{why}\n")

    def status(self, line: str) -> None:
        sys.stderr.write(line + "\n")

    def say(self, line: str, style: str = "") -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


@dataclass
class Chat:
    backend: Backend
    conv: Conversation
    view: Any  # RichView | PlainView
    kernel: Any = None  # judges and runs tool calls (None: no tools available)
    tool_specs: list[dict[str, Any]] | None = None
    done: bool = False
    client: Any = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.client = self.backend.client()

    def send(self, text: str) -> None:
        try:
            stats = turn(self.client, self.backend.model, self.conv, text, self.view, self.kernel, self.tool_specs)
        except KeyboardInterrupt:
            self.view.abort()
            self.view.say("^C: reply stopped", "yellow")
            return
        except Exception as exc:  # the server went away, a bad reply: the session goes on
            self.view.abort()
            import openai

            if isinstance(exc, (openai.APIError, FakError)):
                self.view.say(f"error: {exc}", "red")
                return
            raise
        self.view.status(stats.line(self.backend.context))

    def command(self, line: str) -> None:
        name, _, arg = line[1:].partition(" ")
        arg = arg.strip()
        handler: Callable[[str], None] | None = getattr(self, f"_cmd_{name}", None)
        if handler is None:
            self.view.say(f"unknown command /{name} (/help lists them)", "red")
            return
        try:
            handler(arg)
        except FakError as exc:
            self.view.say(f"error: {exc}", "red")

    def _cmd_help(self, arg: str) -> None:
        self.view.say(HELP)

    def _cmd_exit(self, arg: str) -> None:
        self.done = True

    _cmd_quit = _cmd_exit

    def _cmd_reset(self, arg: str) -> None:
        self.conv.reset()
        self.view.say("conversation cleared", "dim")

    def _cmd_system(self, arg: str) -> None:
        self.conv.system = arg or None
        self.view.say(f"system prompt {'set' if arg else 'cleared'}", "dim")

    def _cmd_save(self, arg: str) -> None:
        if not arg:
            raise FakError("/save needs a file name")
        self.conv.save(arg)
        self.view.say(f"saved {len(self.conv.messages)} messages to {arg}", "dim")

    def _cmd_load(self, arg: str) -> None:
        if not arg:
            raise FakError("/load needs a file name")
        loaded = Conversation.load(arg)
        self.conv.system, self.conv.messages, self.conv.temperature = loaded.system, loaded.messages, loaded.temperature
        self.conv.tools = loaded.tools and self.kernel is not None
        self.view.say(f"loaded {len(self.conv.messages)} messages from {arg}", "dim")

    def _cmd_temp(self, arg: str) -> None:
        try:
            t = float(arg)
        except ValueError:
            raise FakError(f"/temp {arg!r}: expected a number from 0 to 2") from None
        if not 0.0 <= t <= 2.0:
            raise FakError(f"/temp {arg!r}: expected a number from 0 to 2")
        self.conv.temperature = t
        self.view.say(f"temperature {t:g}", "dim")

    def _cmd_tools(self, arg: str) -> None:
        if arg not in ("on", "off"):
            raise FakError("/tools on|off")
        if arg == "on" and self.kernel is None:
            raise FakError("no tools in this session (start it with --tools)")
        self.conv.tools = arg == "on"
        self.view.say(f"tools {arg}", "dim")

    def _cmd_model(self, arg: str) -> None:
        b = self.backend
        where = "in-kernel" if b.local is not None else b.url
        self.view.say(f"{b.model} · {where} · context {b.context or '?'} · temperature {self.conv.temperature:g} · "
                      f"tools {'on' if self.conv.tools else 'off'}")

    def _cmd_stats(self, arg: str) -> None:
        from fak.runtime.views import fetch_stats, stats_view

        d = fetch_stats(self.backend.url, {})
        if isinstance(self.view, RichView):
            self.view.con.print(stats_view(self.backend.url, d))
        else:
            self.view.say(str(d.get("sched")))


def lines_from_terminal(chat: Chat) -> Iterator[str]:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory
    from prompt_toolkit.key_binding import KeyBindings

    path = history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    kb = KeyBindings()

    @kb.add("escape", "enter")
    def _newline(event: Any) -> None:
        event.current_buffer.insert_text("\n")

    session: PromptSession[str] = PromptSession(history=FileHistory(str(path)), key_bindings=kb)
    while not chat.done:
        try:
            yield session.prompt("› ")
        except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh line
            continue
        except EOFError:  # Ctrl-D
            return


def lines_from_pipe(chat: Chat) -> Iterator[str]:
    for line in sys.stdin:
        if chat.done:
            return
        yield line.rstrip("\n")


def run(chat: Chat, tty: bool) -> None:
    for line in (lines_from_terminal if tty else lines_from_pipe)(chat):
        if not line.strip():
            continue
        if line.startswith("/"):
            chat.command(line.strip())
        else:
            chat.send(line)
        if chat.done:
            break
