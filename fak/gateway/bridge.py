"""The scheduler thread seen from the event loop: admit without blocking, await events, cancel.

A Handle notifies its watchers from the scheduler's thread; here that only sets an asyncio.Event
(loop.call_soon_threadsafe), so no request handler ever blocks the loop on the scheduler.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any


@dataclass
class Piece:
    index: int  # the choice it belongs to
    token: int  # -1: text flushed at the end, with no token of its own
    text: str


@dataclass
class Finished:
    index: int
    result: Any  # engine.sched.lane.LaneResult


async def events(handle: Any) -> AsyncIterator[tuple[int, str] | Any]:
    """(token, text) events as they are produced, then the LaneResult."""
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    handle.watch(lambda: loop.call_soon_threadsafe(wake.set))
    seen = 0
    while True:
        await wake.wait()
        wake.clear()
        batch, result = handle.snapshot(seen)
        seen += len(batch)
        for ev in batch:
            yield ev
        if result is not None:
            yield result
            return


async def merged(handles: list[Any]) -> AsyncIterator[Piece | Finished]:
    """The events of n choices interleaved as they come (choice i is handles[i])."""
    queue: asyncio.Queue[Piece | Finished | None] = asyncio.Queue()

    async def pump(i: int, h: Any) -> None:
        async for ev in events(h):
            await queue.put(Piece(i, ev[0], ev[1]) if isinstance(ev, tuple) else Finished(i, ev))

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    done = 0
    try:
        while done < len(handles):
            item = await queue.get()
            if isinstance(item, Finished):
                done += 1
            yield item
    finally:
        for t in tasks:
            t.cancel()


def cancel_all(handles: list[Any]) -> None:
    for h in handles:
        if not h.done:
            h.cancel()
