"""The tiled decode product and dequantizers (engine/kernels/tiledot.py's intrinsics), as numba kernels.

`gemm_tiles(kind, w, x, out)`: x [B, n] float32 quantized per 32 values to int16, then every tile
of w against every lane (groups of 8, 4, 2, 1), parallel over tiles: decode and prefill alike.
`dq_rows_tiles` (embedding take, full dequantize) gives float32 rows. kind: a tiles.KINDS code.

Each compilation holds the bodies of the kinds in KINDS_IN only. `gemm_for(kind)` / `dq_rows_for(kind)`
are the kernels specialised to the kind group holding `kind` (tiles.kind_group): a model compiles the
groups of its weights only. A cold first run of a packaged model (one group, 4 of the 10 kinds):
gemm_tiles, its twin and dq_rows_tiles measured 19 s -> 9 s of compile. The plain names hold all kinds.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from numba import njit, prange

from engine.kernels.amxdot import AMX_KINDS, LANES, amx_ready, scratch_bytes, split_row, tdot16x, tile_config, tile_release
from engine.kernels.blockdot import U, bits_f32, f32_bits
from engine.kernels.parallel import specialised
from engine.kernels.tiledot import X_MAX, dq_tile, tdot1, tdot2, tdot4, tdot8
from engine.quant.tiles import ALL_KINDS, FLOAT_KINDS, KINDS, QB, SB_BYTES, SB_VALUES, TILE, kind_group

KINDS_IN = ALL_KINDS  # the kinds a compilation holds (a literal bit mask; `specialised` rebinds it)
AMX = 0  # 1: 16-lane groups of AMX_KINDS run on AMX (engine/kernels/amxdot.py; gemm_for binds it)
# lanes a pass over a tile needs before it goes to AMX: one 16-lane group alone was slower than vpdpwssd
# (a tile's unpacking is not shared; 16-lane decode of Qwen 2.5 0.5B measured 7% slower), two or more faster
AMX_MIN_LANES = 2 * LANES
PAR_QUANTIZE = (16, 1 << 15)  # rows and values from which gemm_tiles quantizes rows in parallel: a second
# team start in every product cost speculation's few-row verification 7% of its speed (1 lane, 9 rows)
LANE_BLOCK = 64  # lanes per pass over a thread's tiles: 64 x 2048 int16 activations = 256 KiB


@njit(inline="always", cache=True)
def quantize_row_i16(x, xq, dx, sxd):  # type: ignore[no-untyped-def]
    """One row: x float32 [n] -> xq int16 [n], dx and sxd float32 [n / 32]: x ~ xq * dx per block,
    dx = max|x| / 32767, xq = rint(x / dx), sxd = dx * sum(xq) (Q4_K's min term). A block holding
    inf or NaN gets dx = NaN, so the product is NaN as the float product would be. The block's max|x|
    is an integer max over the bits with the sign cleared (non-negative floats order as their bits, inf
    and NaN above every finite value): it vectorises, and it sees a NaN, which the float max() it replaced
    never did (max(0, nan) is 0: the block kept a finite scale and the NaN became a 0). Indices are
    unsigned: no negative-index fix-up in the loops."""
    for blk in range(x.shape[0] // QB):
        o = U(blk * QB)
        top = np.int32(0)
        for i in range(QB):
            top = max(top, f32_bits(x[o + U(i)]) & np.int32(0x7FFFFFFF))
        if top >= np.int32(0x7F800000):
            dx[blk] = np.float32(np.nan)
            sxd[blk] = np.float32(np.nan)
            for i in range(QB):
                xq[o + U(i)] = 0
            continue
        d = np.float32(bits_f32(top) / np.float32(X_MAX))
        inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
        s = np.int32(0)  # |sum| <= 32 * 32767
        for i in range(QB):
            q = np.int16(np.rint(x[o + U(i)] * inv))
            xq[o + U(i)] = q
            s += np.int32(q)
        dx[blk] = d
        sxd[blk] = d * np.float32(s)


@njit(inline="always", cache=True)
def quantize_rows_i16(x, xq, dx, sxd):  # type: ignore[no-untyped-def]
    """x float32 [B, n] -> xq int16 [B, n], dx and sxd float32 [B, n / 32], a row at a time (quantize_row_i16)."""
    for lane in range(x.shape[0]):
        quantize_row_i16(x[lane], xq[lane], dx[lane], sxd[lane])


@njit(inline="always", cache=True)
def _block_end(l0, lanes, amx):  # type: ignore[no-untyped-def]
    """Where the lane block from l0 ends: LANE_BLOCK lanes; on AMX a last block too small for it joins this one."""
    l1 = min(lanes, l0 + LANE_BLOCK)
    if amx and lanes - l1 < AMX_MIN_LANES:
        l1 = lanes
    return l1


@njit(inline="always", cache=True)
def _amx_end(l0, l1, amx):  # type: ignore[no-untyped-def]
    """The first lane of block [l0, l1) that AMX does not take: past its 16-lane groups, or l0 (too few lanes)."""
    return l0 + (l1 - l0) // LANES * LANES if amx and l1 - l0 >= AMX_MIN_LANES else l0


@njit(parallel=True, nogil=True, cache=True)
def gemm_tiles(kind, w, x, out):  # type: ignore[no-untyped-def]
    """out[B, rows] = x[B, n] @ W.T for a tiled weight w (kind: a tiles.KINDS code; shape
    tiles.tiled_shape), parallel over tiles; with AMX bound (from AMX_MIN_LANES rows, AMX_KINDS) a lane block's
    16-lane groups meet a tile on the tile unit (engine/kernels/amxdot.py), and every other lane group of 8, 4,
    2 or 1 meets it on vpdpwssd: the same bits either way."""
    ntiles, tile_bytes = w.shape
    lanes, n = x.shape
    rows = out.shape[1]
    if kind < 0 or kind >= len(KINDS) or not KINDS_IN >> kind & 1:
        raise ValueError("gemm_tiles: the kind is not one this compilation holds")
    nsb = n // SB_VALUES[kind]
    # the tile dots read raw addresses: every size and stride they rely on is checked here
    if (nsb * SB_VALUES[kind] != n or nsb * SB_BYTES[kind] != tile_bytes or out.shape[0] != lanes
            or rows > ntiles * TILE or rows <= (ntiles - 1) * TILE or w.strides[1] != 1 or out.strides[1] != 4
            or x.strides[1] != 4 or (lanes > 1 and x.strides[0] != 4 * n)):
        raise ValueError("gemm_tiles: weight, activation and output shapes do not match")
    m = 0 if kind >= FLOAT_KINDS else n  # float tiles read x itself
    buf = np.empty(lanes * m + 32, dtype=np.int16)  # 64-byte aligned: a block's 32 int16 = one line
    skip = ((64 - buf.ctypes.data % 64) % 64) // 2
    xq = buf[skip: skip + lanes * m].reshape((lanes, m))
    dx = np.empty((lanes, m // QB), dtype=np.float32)
    sxd = np.empty((lanes, m // QB), dtype=np.float32)
    # a row per worker: serial, this pass was ~15% of an 80-row ffn_down
    if m and lanes >= PAR_QUANTIZE[0] and lanes * m >= PAR_QUANTIZE[1]:
        for lane in prange(lanes):
            quantize_row_i16(x[lane], xq[lane], dx[lane], sxd[lane])
    elif m:
        quantize_rows_i16(x, xq, dx, sxd)
    amx = AMX and m and lanes >= AMX_MIN_LANES and AMX_KINDS >> kind & 1
    ng = lanes // LANES if amx else 0  # 16-lane groups on AMX: activations split per block, scales side by side
    xpk = np.empty((ng, m // QB, LANES, 2 * QB), dtype=np.int8)
    dxt = np.empty((ng, m // QB, LANES), dtype=np.float32)
    sxt = np.empty_like(dxt)
    if amx:
        for lane in prange(ng * LANES):
            g, j = lane // LANES, lane % LANES
            split_row(xq[lane], xpk[g], j)
            dxt[g, :, j] = dx[lane]
            sxt[g, :, j] = sxd[lane]
    wa, oa = U(w.ctypes.data), U(out.ctypes.data)
    ws, os_ = U(w.strides[0]), U(out.strides[0])
    nc = min(ntiles, 64)
    sbytes = scratch_bytes(m) if amx else 0
    for c in prange(nc):
        t0, t1 = c * ntiles // nc, (c + 1) * ntiles // nc
        if amx:  # the lane blocks' 16-lane groups on AMX (scratch passed in: the call keeps it alive)
            scratch = np.empty(sbytes, dtype=np.uint8)
            tile_config()
            l0 = 0
            while l0 < lanes:
                l1 = _block_end(l0, lanes, amx)
                groups = (_amx_end(l0, l1, amx) - l0) // LANES
                for t in range(t0, t1 if groups else t0):
                    tdot16x(KINDS_IN, kind, wa + U(t) * ws, xpk, dxt, sxt, l0, groups, nsb,
                            oa + U(t * TILE * 4) + U(l0) * os_, os_, min(TILE, rows - t * TILE), scratch)
                l0 = l1
            tile_release()
        # lanes in blocks of LANE_BLOCK (a prefill chunk's activations stay in L2 while the chunk's
        # tiles pass), each tile meeting the block's lanes (those AMX did not take) 8, 4, 2, 1 at a time
        l0 = 0
        while l0 < lanes:
            l1 = _block_end(l0, lanes, amx)
            lo = _amx_end(l0, l1, amx)
            for t in range(t0, t1 if lo < l1 else t0):
                valid = min(TILE, rows - t * TILE)
                wt, ot = wa + U(t) * ws, oa + U(t * TILE * 4)
                b = lo
                while b + 8 <= l1:
                    tdot8(KINDS_IN, kind, wt, xq, dx, sxd, x, b, nsb, ot + U(b) * os_, os_, valid)
                    b += 8
                if b + 4 <= l1:
                    tdot4(KINDS_IN, kind, wt, xq, dx, sxd, x, b, nsb, ot + U(b) * os_, os_, valid)
                    b += 4
                if b + 2 <= l1:
                    tdot2(KINDS_IN, kind, wt, xq, dx, sxd, x, b, nsb, ot + U(b) * os_, os_, valid)
                    b += 2
                while b < l1:
                    tdot1(KINDS_IN, kind, wt, xq, dx, sxd, x, b, nsb, ot + U(b) * os_, os_, valid)
                    b += 1
            l0 = l1
        if amx:
            tile_release()


@njit(cache=True, nogil=True)
def dq_rows_tiles(kind, w, rows, out):  # type: ignore[no-untyped-def]
    """Weight rows `rows` (any order) as float32 out[len(rows), n]: each through its whole tile.
    Serial: it serves the embedding take (one row a token) and whole-weight dequantize (tests,
    diagnostics), and a parallel build of it cost 8.5 s of first-run compile."""
    if kind < 0 or kind >= len(KINDS) or not KINDS_IN >> kind & 1:
        raise ValueError("dq_rows_tiles: the kind is not one this compilation holds")
    n = out.shape[1]
    nsb = n // SB_VALUES[kind]
    if nsb * SB_VALUES[kind] != n or nsb * SB_BYTES[kind] != w.shape[1] or w.strides[1] != 1:
        raise ValueError("dq_rows_tiles: weight and output shapes do not match")
    for j in range(rows.shape[0]):
        if rows[j] < 0 or rows[j] // TILE >= w.shape[0]:
            raise ValueError("dq_rows_tiles: row out of range")
    wa, ws = U(w.ctypes.data), U(w.strides[0])
    for j in range(rows.shape[0]):
        tile = np.empty((TILE, n), dtype=np.float32)
        dq_tile(KINDS_IN, kind, wa + U(rows[j] // TILE) * ws, nsb, tile, 0)
        out[j, :] = tile[rows[j] % TILE]


@functools.cache  # a lookup per product call: an int key, not specialised()'s sort
def gemm_for(kind: int) -> Any:
    """gemm_tiles compiled for the kind group holding `kind` (launch it as gemm_tiles)."""
    return specialised(gemm_tiles, KINDS_IN=kind_group(kind), AMX=int(amx_ready()))


@functools.cache
def dq_rows_for(kind: int) -> Any:
    """dq_rows_tiles compiled for the kind group holding `kind`."""
    return specialised(dq_rows_tiles, KINDS_IN=kind_group(kind))
