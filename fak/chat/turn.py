"""One turn: the user's message, the model's streamed reply, and (with tools on) every call the model
proposes judged by the chat's kernel, run if allowed, its result (admitted) sent back, until the model
answers without calls. A turn cut by Ctrl-C leaves the conversation as it was before it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from fak.chat.conversation import Conversation
from fak.chat.status import TurnStats

MAX_ROUNDS = 8  # model calls per turn: a model that keeps calling tools is stopped here


@dataclass
class CallShown:
    """A tool call as the kernel judged it (what the screen shows)."""

    name: str
    arguments: str
    verdict: str
    reason: str
    detail: str
    result: str  # what the model is sent back


class View:
    """What a turn writes; the REPL gives a rich one on a terminal, a plain one otherwise."""

    def text(self, piece: str) -> None: ...
    def end_reply(self, text: str) -> None: ...
    def call(self, shown: CallShown) -> None: ...


def run_tool(kernel: Any, name: str, arguments: str) -> CallShown:
    from fak.core import notes
    from fak.core.abi import ToolCall

    call = ToolCall("tool", name, engine="sandbox", args=(arguments or "{}").encode(), meta={"source": "chat"})
    s = notes.shown(name, kernel.syscall(call))
    return CallShown(name, arguments, s.verdict, s.reason, s.detail, s.text)


def _stream(client: Any, model: str, conv: Conversation, tools: list[dict[str, Any]] | None, view: View,
            stats: TurnStats) -> tuple[str, list[dict[str, Any]]]:
    stream = client.chat.completions.create(model=model, messages=conv.wire(), tools=tools,
                                            temperature=conv.temperature, max_tokens=conv.max_tokens, stream=True,
                                            stream_options={"include_usage": True})
    text, calls = "", {}  # type: ignore[var-annotated]
    first = last = None
    try:
        for chunk in stream:
            if chunk.usage is not None:
                stats.prompt = chunk.usage.prompt_tokens
                details = chunk.usage.prompt_tokens_details
                stats.cached = (details.cached_tokens or 0) if details is not None else 0
                stats.generated += chunk.usage.completion_tokens
            if not chunk.choices:
                continue
            d = chunk.choices[0].delta
            now = time.perf_counter()
            first = first or now
            last = now
            if d.content:
                text += d.content
                view.text(d.content)
            for tc in d.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                c["id"] = tc.id or c["id"]
                if tc.function is not None:
                    c["name"] += tc.function.name or ""
                    c["arguments"] += tc.function.arguments or ""
    finally:
        stream.close()  # on Ctrl-C too: the server cancels the lane when the connection goes
    stats.calls += 1
    if first is not None and last is not None:
        stats.decode_s += last - first
    return text, [calls[i] for i in sorted(calls)]


def turn(client: Any, model: str, conv: Conversation, user: str, view: View, kernel: Any = None,
         tool_specs: list[dict[str, Any]] | None = None) -> TurnStats:
    stats = TurnStats()
    mark = len(conv.messages)
    conv.messages.append({"role": "user", "content": user})
    tools = tool_specs if conv.tools and kernel is not None else None
    try:
        for _ in range(MAX_ROUNDS):
            text, calls = _stream(client, model, conv, tools, view, stats)
            view.end_reply(text)
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                msg["tool_calls"] = [{"id": c["id"], "type": "function",
                                      "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
            conv.messages.append(msg)
            if not calls:
                break
            for c in calls:
                shown = run_tool(kernel, c["name"], c["arguments"])
                view.call(shown)
                conv.messages.append({"role": "tool", "tool_call_id": c["id"], "content": shown.result})
    except BaseException:
        del conv.messages[mark:]  # a cut turn leaves no half in the history
        raise
    return stats


def args_preview(arguments: str, width: int = 120) -> str:
    try:
        text = json.dumps(json.loads(arguments), ensure_ascii=False)
    except ValueError:
        text = arguments
    return text if len(text) <= width else text[: width - 1] + "…"
