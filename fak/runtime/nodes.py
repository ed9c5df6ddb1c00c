"""build_node: the one way a worker node (P/D prefill, P/D decode, pipeline stage) is built from a boot.

Both hosts use it: a `fak worker` process (commands/worker.py) and a Ray actor (fak/runtime/ray.py). The
node comes back listening and warmed; a stage keeps only the weights of its band. Errors are one line
(FakError): a port that cannot be listened on, a band or option the engine refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fak.errors import FakError

ROLES = ("prefill", "decode", "stage")


def build_node(role: str, booted: Any, *, name: str | None = None, host: str = "127.0.0.1", port: int = 0,
               layers: tuple[int, int] | None = None, prefill_chunk: int = 64, shm_bytes: int | None = None,
               key: bytes = b"", encrypt: bool = False, stage_addresses: list[str] | None = None,
               rejoin: Callable[[int, str], str] | None = None, **sched: Any) -> Any:
    """A warmed node for `role` over `booted` (a Booted, or anything with .model and .tokenizer).

    stage: `layers` (LO, HI) is its band. decode: `stage_addresses` makes it a pipelined decode worker
    (its layers on those stage workers, `rejoin(i, why)` to get stage i back); `sched` are the scheduler's
    keyword arguments (max_running, kv_blocks, block_tokens, ...). prefill: `sched["block_tokens"]`.
    `key`: the cluster key (every link handshaken on it, every message sealed; `encrypt` too); without one
    the node listens on loopback only."""
    from engine.wire.secure import LinkKey, LinkRefused, check_bind

    if role not in ROLES:
        raise FakError(f"--role {role!r}: expected one of {', '.join(ROLES)}")
    try:
        link = LinkKey.of(key, encrypt)
        check_bind(host, link, f"--listen {host}:{port}")
    except LinkRefused as e:
        raise FakError(str(e)) from None
    key = link.frame_key if link is not None else b""  # frame descriptors get a key of their own
    try:
        if role == "stage":
            if layers is None:
                raise FakError("a stage worker needs its band (--layers LO:HI)")
            return _stage(booted.model, layers, host, port, name, link)
        if role == "prefill":
            return _prefill(booted.model, host, port, name, key, link, prefill_chunk, sched)
        return _decode(booted, host, port, name, key, link, prefill_chunk, shm_bytes, stage_addresses, rejoin, sched)
    except OSError as e:
        raise FakError(f"--listen {host}:{port}: {e.strerror or e}") from None


def _stage(model: Any, band: tuple[int, int], host: str, port: int, name: str | None, link: Any) -> Any:
    from engine.errors import EngineError
    from engine.pipeline.stage_node import StageNode

    try:
        node = StageNode(model, band[0], band[1], name, host=host, port=port, link=link)
    except EngineError as e:
        raise FakError(f"--layers {band[0]}:{band[1]}: {e}") from None
    keep_band(model, *band, last=band[1] == model.config.n_layers)
    return node


def keep_band(model: Any, lo: int, hi: int, last: bool) -> None:
    """Drop the weights a stage never reads: the other layers, and the embedding and head unless it is
    the last stage (which applies the LM head)."""
    w = model.weights
    for i in range(len(w.layers)):
        if not lo <= i < hi:
            w.layers[i] = None
    if not last:
        w.token_embd = w.output = None


def held_layers(model: Any) -> list[int]:
    """The layer indices whose weights `model` still holds (a stage: its band)."""
    return [i for i, layer in enumerate(model.weights.layers) if layer is not None]


def _prefill(model: Any, host: str, port: int, name: str | None, key: bytes, link: Any, prefill_chunk: int,
             sched: dict[str, Any]) -> Any:
    from engine.errors import EngineError
    from engine.model.session import warmup
    from engine.pd.prefill_node import PrefillNode

    try:
        bt = {"block_tokens": sched["block_tokens"]} if sched.get("block_tokens") is not None else {}
        node = PrefillNode(model, name or f"prefill-{port}", host=host, port=port, key=key, link=link,
                           prefill_chunk=prefill_chunk, **bt)
        node.worker.submit(warmup).result()  # on the thread that runs them
    except EngineError as e:
        raise FakError(str(e)) from None
    return node


def _decode(booted: Any, host: str, port: int, name: str | None, key: bytes, link: Any, prefill_chunk: int,
            shm_bytes: int | None, stage_addresses: list[str] | None, rejoin: Callable[[int, str], str] | None,
            sched: dict[str, Any]) -> Any:
    from engine.errors import EngineError
    from engine.pd.decode_node import DecodeNode
    from fak.runtime.boot import eos_ids

    model, tok = booted.model, booted.tokenizer
    try:
        served: Any = model
        if stage_addresses:  # a pipelined decode worker: its layers on stage workers, its scheduler and KV pool here
            from engine.pipeline.pipeline import remote_pipeline

            served = remote_pipeline(model, stage_addresses, transport="tcp", rejoin=rejoin, link=link)
        extra = {} if shm_bytes is None else {"shm_bytes": shm_bytes}
        node = DecodeNode(served, name or f"decode-{port}", host=host, port=port, key=key, link=link, tokenizer=tok,
                          eos_ids=eos_ids(tok, model.config), prefill_chunk=prefill_chunk, warm=True,
                          **extra, **sched)
        node.worker.sched.warmed.wait()
    except EngineError as e:
        raise FakError(str(e)) from None
    return node
