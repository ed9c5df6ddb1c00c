"""A stand-in coding agent on the official SDKs (anthropic, openai), for `fak guard` tests: it offers
one shell tool, runs every call it receives with bash in its working directory, sends the output
back, and stops when the model answers without calls (or after --max-turns).

    python tests/support/standins/agent.py --wire anthropic|chat|responses [--no-stream] PROMPT

Base URL and key come from the environment, as for any SDK user (ANTHROPIC_BASE_URL /
OPENAI_BASE_URL). It runs commands only inside a sandbox: FAK_STANDIN_SANDBOX must name its cwd.
Each executed command is printed as `$ CMD`, each text reply as is.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
CODEX_SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}


def sh(command: str) -> str:
    print(f"$ {command}", flush=True)
    try:
        p = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "timed out"
    out = p.stdout + p.stderr
    print(out, end="" if out.endswith("\n") or not out else "\n", flush=True)
    return out or f"(exit {p.returncode})"


def anthropic_agent(prompt: str, model: str, stream: bool, turns: int, opts: dict[str, Any]) -> None:
    import anthropic

    client = anthropic.Anthropic()
    opts = {"extra_body": opts} if opts else {}  # this SDK has no temperature argument; the wire has the field
    tools = [{"name": "Bash", "description": "Run a shell command.", "input_schema": SCHEMA}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for _ in range(turns):
        if stream:
            with client.messages.stream(model=model, max_tokens=256, tools=tools, messages=messages, **opts) as s:
                for text in s.text_stream:
                    print(text, end="", flush=True)
                msg = s.get_final_message()
            print(flush=True)
        else:
            msg = client.messages.create(model=model, max_tokens=256, tools=tools, messages=messages, **opts)
            print("".join(b.text for b in msg.content if b.type == "text"), flush=True)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
        uses = [b for b in msg.content if b.type == "tool_use"]
        if not uses:
            return
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": u.id, "content": sh(str(u.input.get("command", "")))} for u in uses]})


def chat_agent(prompt: str, model: str, stream: bool, turns: int, opts: dict[str, Any]) -> None:
    import openai

    client = openai.OpenAI()
    tools = [{"type": "function", "function": {"name": "run_command", "description": "Run a shell command.",
                                               "parameters": SCHEMA}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for _ in range(turns):
        calls: dict[int, dict[str, str]] = {}
        text = ""
        if stream:
            for chunk in client.chat.completions.create(model=model, messages=messages, tools=tools, stream=True, **opts):
                if not chunk.choices:
                    continue
                d = chunk.choices[0].delta
                if d.content:
                    text += d.content
                    print(d.content, end="", flush=True)
                for tc in d.tool_calls or []:
                    c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    c["id"] = tc.id or c["id"]
                    c["name"] = (tc.function.name if tc.function else None) or c["name"]
                    c["arguments"] += (tc.function.arguments if tc.function else None) or ""
            print(flush=True)
        else:
            m = client.chat.completions.create(model=model, messages=messages, tools=tools, **opts).choices[0].message
            text = m.content or ""
            print(text, flush=True)
            for i, tc in enumerate(m.tool_calls or []):
                calls[i] = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments}
        messages.append({"role": "assistant", "content": text or None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls.values()] or None})
        if not calls:
            return
        for c in calls.values():
            messages.append({"role": "tool", "tool_call_id": c["id"],
                             "content": sh(str(json.loads(c["arguments"] or "{}").get("command", "")))})


def responses_agent(prompt: str, model: str, stream: bool, turns: int, opts: dict[str, Any]) -> None:
    import openai

    client = openai.OpenAI()
    tools = [{"type": "function", "name": "exec_command", "description": "Run a shell command.",
              "parameters": CODEX_SCHEMA, "strict": False}]
    items: list[Any] = [{"role": "user", "content": prompt}]
    for _ in range(turns):
        if stream:
            with client.responses.stream(model=model, input=items, tools=tools, **opts) as s:
                for ev in s:
                    if ev.type == "response.output_text.delta":
                        print(ev.delta, end="", flush=True)
                resp = s.get_final_response()
            print(flush=True)
        else:
            resp = client.responses.create(model=model, input=items, tools=tools, **opts)
            print(resp.output_text, flush=True)
        calls = [it for it in resp.output if it.type == "function_call"]
        items += [it.model_dump(exclude_none=True) for it in resp.output]
        if not calls:
            return
        for c in calls:
            items.append({"type": "function_call_output", "call_id": c.call_id,
                          "output": sh(str(json.loads(c.arguments or "{}").get("cmd", "")))})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wire", choices=("anthropic", "chat", "responses"), required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--exit-code", type=int, default=0, help="exit with this code when done (tests)")
    ap.add_argument("prompt")
    a = ap.parse_args()
    if os.environ.get("FAK_STANDIN_SANDBOX") != os.getcwd():
        print("standin: refusing to run commands outside its sandbox (FAK_STANDIN_SANDBOX must be the cwd)", file=sys.stderr)
        return 2
    model = a.model or ("claude-sonnet-4-5" if a.wire == "anthropic" else "gpt-5-codex")
    {"anthropic": anthropic_agent, "chat": chat_agent, "responses": responses_agent}[a.wire](
        a.prompt, model, not a.no_stream, a.max_turns, {} if a.temperature is None else {"temperature": a.temperature})
    return a.exit_code


if __name__ == "__main__":
    sys.exit(main())
