"""KV frame transports: inproc, shm and tcp move frames intact (a large one too), across a real second
process for shm and tcp, and a closed or dead peer is a clear TransportClosed / TransportTimeout."""

from __future__ import annotations

import multiprocessing as mp
import threading

import numpy as np
import pytest
import xxhash

from engine.model.synthetic import synthetic_model
from engine.wire import (
    Descriptor,
    ShmReceiver,
    ShmSender,
    TcpReceiver,
    TcpSender,
    TransportClosed,
    TransportError,
    TransportTimeout,
    export_blocks,
    import_blocks,
    inproc_pair,
)
from support.dist_peers import payload, shm_send, tcp_recv, tcp_send_partial

pytestmark = pytest.mark.timeout(120)
SIZES = [1, 100, 4096, 70_001, 8 << 20, 3]  # includes an 8 MB frame
CTX = mp.get_context("spawn")


def _digest(b: object) -> str:
    return xxhash.xxh3_128_hexdigest(b)  # type: ignore[arg-type]


def test_inproc_frames_intact_and_closed_peer() -> None:
    tx, rx = inproc_pair()
    for i, n in enumerate(SIZES):
        tx.send(payload(i, n))
    for i, n in enumerate(SIZES):
        assert rx.recv(timeout=5) == payload(i, n)
    with pytest.raises(TransportTimeout):
        rx.recv(timeout=0.01)
    tx.close()
    with pytest.raises(TransportClosed, match="sender closed"):
        rx.recv(timeout=1)
    tx2, rx2 = inproc_pair()
    rx2.close()
    with pytest.raises(TransportClosed, match="receiver is closed"):
        tx2.send(b"x")


def test_kv_frame_through_every_transport_imports_identically() -> None:
    m = synthetic_model()
    pool = m.new_pool(8)
    blocks = [pool.allocate() for _ in range(3)]
    pool.k[:, blocks] = np.random.default_rng(0).standard_normal(pool.k[:, blocks].shape)
    pool.v[:, blocks] = np.random.default_rng(1).standard_normal(pool.v[:, blocks].shape)
    frame = export_blocks(pool, blocks, [11, 22, 33], [0, 16, 32], Descriptor("s", False, "allow"), m.identity)
    shm_rx = ShmReceiver(1 << 20)
    tcp_rx = TcpReceiver()
    pairs = [inproc_pair(), (ShmSender(shm_rx.name), shm_rx), (TcpSender(*tcp_rx.address), tcp_rx)]
    for tx, rx in pairs:
        t = threading.Thread(target=tx.send, args=(frame, 5))
        t.start()
        got = rx.recv(timeout=5)
        t.join()
        dst = m.new_pool(8)
        ids = import_blocks(dst, got, m.identity)
        assert np.array_equal(dst.k[:, ids], pool.k[:, blocks]) and np.array_equal(dst.v[:, ids], pool.v[:, blocks])
        tx.close()
        rx.close()


def test_shm_ring_wraps_and_refuses_oversize() -> None:
    rx = ShmReceiver(256 << 10)
    tx = ShmSender(rx.name)
    sizes = [(i * 37_003) % 120_000 + 1 for i in range(40)]  # many wraps of a 256 KB ring
    t = threading.Thread(target=lambda: [tx.send(payload(i, n), timeout=10) for i, n in enumerate(sizes)])
    t.start()
    for i, n in enumerate(sizes):
        assert rx.recv(timeout=10) == payload(i, n)
    t.join()
    with pytest.raises(TransportError, match="does not fit"):
        tx.send(bytes(300 << 10))
    rx.close()
    with pytest.raises(TransportClosed, match="receiver closed"):
        tx.send(b"x", timeout=1)
    tx.close()
    with pytest.raises(TransportClosed, match="no ring named"):
        ShmSender(rx.name)


def test_shm_across_processes() -> None:
    rx = ShmReceiver(16 << 20)
    try:
        p = CTX.Process(target=shm_send, args=(rx.name, SIZES, True))
        p.start()
        for i, n in enumerate(SIZES):
            assert _digest(rx.recv(timeout=60)) == _digest(payload(i, n))
        with pytest.raises(TransportClosed, match="sender closed"):
            rx.recv(timeout=30)
        p.join(30)
        assert p.exitcode == 0
    finally:
        rx.close()


def test_shm_dead_sender_times_out() -> None:
    rx = ShmReceiver(1 << 20)
    p = CTX.Process(target=shm_send, args=(rx.name, [10], False))
    p.start()
    assert rx.recv(timeout=60) == payload(0, 10)
    p.join(30)
    with pytest.raises(TransportTimeout, match="no frame within 0.2 s"):
        rx.recv(timeout=0.2)
    rx.close()


def test_tcp_across_processes() -> None:
    port_q, result_q = CTX.Queue(), CTX.Queue()
    p = CTX.Process(target=tcp_recv, args=(port_q, result_q, len(SIZES)))
    p.start()
    tx = TcpSender("127.0.0.1", port_q.get(timeout=60))
    for i, n in enumerate(SIZES):
        tx.send(payload(i, n), timeout=30)
    tx.close()
    out = result_q.get(timeout=60)
    p.join(30)
    assert out[:-1] == [_digest(payload(i, n)) for i, n in enumerate(SIZES)]
    assert out[-1] == "TransportClosed: tcp transport: the sender closed the connection between frames"


def test_tcp_peer_dies_mid_frame_and_closed_receiver() -> None:
    rx = TcpReceiver()
    p = CTX.Process(target=tcp_send_partial, args=(rx.address[1], 1 << 20))
    p.start()
    with pytest.raises(TransportClosed, match=r"after 524288 of 1048576 bytes of a frame"):
        rx.recv(timeout=60)
    p.join(30)
    rx.close()
    with pytest.raises(TransportClosed, match="cannot connect"):
        TcpSender(*rx.address, timeout=2)
    rx = TcpReceiver()
    tx = TcpSender(*rx.address)
    threading.Thread(target=lambda: rx.recv(timeout=5) and rx.close()).start()
    tx.send(b"one", timeout=5)
    with pytest.raises(TransportClosed, match="receiver closed"):
        for _ in range(1000):  # the first sends after the close may still land in the socket buffers
            tx.send(bytes(1 << 16), timeout=5)
    tx.close()
    with pytest.raises(TransportTimeout, match="no sender connected"):
        TcpReceiver().recv(timeout=0.1)  # nobody connects
