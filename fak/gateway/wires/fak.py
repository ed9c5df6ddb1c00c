"""fak's own routes: POST /v1/fak/adjudicate (the verdict the loaded policy gives a tool call, as a
dry run: nothing dispatched, nothing journaled) and POST /v1/fak/syscall (submit + reap: adjudicated,
journaled, dispatched to the kernel's engine when allowed, its result admitted)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Request

from fak.gateway.errors import APIError
from fak.gateway.wires.protocol import SyscallRequest

router = APIRouter()


def _call(body: SyscallRequest) -> Any:
    from fak.core.abi import ToolCall

    raw = body.arguments if isinstance(body.arguments, str) else json.dumps(body.arguments, ensure_ascii=False)
    return ToolCall("tool", body.tool, args=raw.encode(), trace_id=body.trace_id or "", meta={"source": "api"})


def _decision(decision: Any) -> dict[str, Any]:
    call = decision.call
    try:
        args: Any = json.loads(call.args)
    except ValueError:
        args = call.args.decode("utf-8", "replace")
    return {"tool": call.tool, "arguments": args, "seq_no": call.seq_no if call.seq_no >= 0 else None,
            "verdict": decision.verdict.to_dict(), "allowed": decision.verdict.allowed}


@router.post("/v1/fak/adjudicate")
async def adjudicate(body: SyscallRequest, request: Request) -> dict[str, Any]:
    return _decision(request.app.state.kernel.adjudicate(_call(body)))


@router.post("/v1/fak/syscall")
async def syscall(body: SyscallRequest, request: Request) -> dict[str, Any]:
    from fak.errors import FakError

    kernel = request.app.state.kernel

    def run() -> dict[str, Any]:  # off the event loop: the journal fsyncs, an engine may block
        decision = kernel.submit(_call(body))
        result = kernel.reap(decision)
        payload = result.payload if isinstance(result.payload, dict) else {"bytes": len(result.payload)}
        return _decision(decision) | {"result": {"status": result.status.value, "payload": payload}}

    try:
        return await asyncio.to_thread(run)
    except FakError as exc:  # a journal that cannot be written: no record, so no decision
        raise APIError(503, str(exc), type="server_error", code="journal_error") from None
