"""Int16 tiles built at run time from float32 matrices, and their products on the integer dot instructions.

Why: prefill attention's two products (Q.K^T and P.V) ran through float32 BLAS at the FMA ports' peak
(~125 GFLOP/s a core here), ~85% of a 16k-token prefill's attention. `vpdpwssd` does twice the
multiply-adds of an FMA per instruction, and the tiled weight products (engine/kernels/tiledot.py) already
run on it. Attention's operands are not weights: they are built per key tile, so they get a tile of their
own, made here in one pass.

The numbers: a float32 matrix A [R, C] becomes tiles of 16 rows; each 32-value block of a row is
quantized to integers in +-LIMIT with its own scale, max|a| / LIMIT; the other operand is quantized the
same way per 32 values (`quantize_rows`). LIMIT is 8191, not int16's 32767: a block's sum of 32
products must fit an int32 however the values fall (32 * 8191^2 < 2^31; at 32767 two blocks of large
same-signed values overflow, which a test shows). So a value's error is at most half a step, 6.1e-5 of
its block's largest value: 8x finer than the f16 KV cache's own rounding (2^-11). Integer sums are exact;
per block, acc = fma(float(I), sa * sx, acc), in block order. So a product's bits depend on its two
operands only (not on the lane group, the tile order or the thread).

Layout of a tile (16 rows, `nblk` blocks of 32 values): `vals` int32 [nblk, 16, 16], each an int16 pair:
block b, pair vector k holds values 2k (low half) and 2k+1 of the 16 rows, so one 64-byte vector meets a broadcast pair of the
other operand in one `vpdpwssd` that adds into all 16 rows' sums; `scales` float32 [nblk, 16].
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.blockdot import P8, VF16, _at, _c, _fma, _prefetch, _splat, bits_f32
from engine.kernels.tiledot import VI16, _dpwssd, _load, _store_lanes, lane_rows

TILE = 16  # rows per tile: one zmm of int32 row sums
QB = 32  # values per block
PAIR_BYTES = 64  # one pair vector: 2 values x 16 rows x int16
U = np.uint64
BLOCK_BYTES = TILE * PAIR_BYTES  # a block's values in a tile
LIMIT = 8191.0  # the integers' range, +-LIMIT: 32 products of two such fit an int32 (see above)


@njit(inline="always", cache=True)
def tile_count(rows: int) -> int:
    return (rows + TILE - 1) // TILE


@njit(inline="always", cache=True)
def block_count(cols: int) -> int:
    return (cols + QB - 1) // QB


@njit(inline="always", cache=True)
def _pair(lo, hi, inv):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """Two values quantized (x * inv, rounded) as one int32: lo in the low half (the lower address)."""
    a = np.int32(np.rint(lo * inv)) & np.int32(0xFFFF)
    return a | (np.int32(np.rint(hi * inv)) << np.int32(16))


@njit(nogil=True, cache=True)
def build_tiles(a, vals, scales):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """a float32 [R, C] (C-contiguous) -> tiles of its rows: vals int32 [tiles, blocks, 16, 16] (int16 pairs),
    scales float32 [tiles, blocks, 16] (tiles = ceil(R / 16), blocks = ceil(C / 32)); rows past R and values
    past C are zero. A block holding inf or NaN gets a NaN scale, so its products are NaN as float ones
    would be. The block's max |a| is an integer max over the bits (see quantize_rows)."""
    rows, cols = a.shape
    nt, nb = vals.shape[0], vals.shape[1]
    if nt * TILE < rows or nb * QB < cols or scales.shape[0] != nt or scales.shape[1] != nb:
        raise ValueError("build_tiles: the tiles do not hold the matrix")
    ai = a.view(np.int32)
    buf = np.zeros(QB, dtype=np.float32)
    for t in range(nt):
        for i in range(TILE):
            r = t * TILE + i
            for blk in range(nb):
                c0 = blk * QB
                m = max(0, min(QB, cols - c0)) if r < rows else 0
                top = np.int32(0)
                for j in range(m):
                    top = max(top, ai[r, c0 + j] & np.int32(0x7FFFFFFF))
                for j in range(m):
                    buf[j] = a[r, c0 + j]
                for j in range(m, QB):
                    buf[j] = 0.0
                d = np.float32(bits_f32(top) / np.float32(LIMIT))
                if top >= np.int32(0x7F800000):  # inf or NaN
                    d = np.float32(np.nan)
                    buf[:] = 0.0
                inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
                scales[t, blk, i] = d
                for k in range(TILE):
                    vals[t, blk, k, i] = _pair(buf[2 * k], buf[2 * k + 1], inv)


@njit(nogil=True, cache=True)
def build_tiles_t(a, vals, scales):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """a float32 [C, R] (C-contiguous) -> tiles of the rows of a.T (as build_tiles(a.T) gives, without the
    transpose: each block's 32 rows of `a` are walked once, every step a contiguous row)."""
    cols, rows = a.shape
    nt, nb = vals.shape[0], vals.shape[1]
    if nt * TILE < rows or nb * QB < cols or scales.shape[0] != nt or scales.shape[1] != nb:
        raise ValueError("build_tiles_t: the tiles do not hold the matrix")
    ai = a.view(np.int32)
    width = nt * TILE
    top = np.zeros(width, dtype=np.int32)
    mag = top.view(np.float32)
    inv = np.zeros(width, dtype=np.float32)
    for blk in range(nb):
        c0 = blk * QB
        m = max(0, min(QB, cols - c0))
        top[:] = 0
        for j in range(m):
            for r in range(rows):
                top[r] = max(top[r], ai[c0 + j, r] & np.int32(0x7FFFFFFF))
        for r in range(width):
            d = np.float32(mag[r] / np.float32(LIMIT))
            if top[r] >= np.int32(0x7F800000):  # inf or NaN
                d = np.float32(np.nan)
            inv[r] = np.float32(1.0) / d if d > 0 else np.float32(0.0)
            scales[r // TILE, blk, r % TILE] = d
        for k in range(TILE):
            j0, j1 = c0 + 2 * k, c0 + 2 * k + 1
            for r in range(width):
                lo = a[j0, r] if j0 < cols and r < rows else np.float32(0.0)
                hi = a[j1, r] if j1 < cols and r < rows else np.float32(0.0)
                vals[r // TILE, blk, k, r % TILE] = _pair(lo, hi, inv[r])  # a NaN block: inv 0, values 0


@njit(nogil=True, cache=True)
def quantize_rows(x, cols, xq, dx):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """x float32 [B, >= cols] (C-contiguous) -> xq int16 [B, 32 * blocks] (values past `cols` zero), dx float32
    [B, blocks]: x ~ xq * dx per block of 32, |xq| <= LIMIT. A block holding inf or NaN gets dx = NaN, so
    its products are NaN as float ones would be. The block's max |x| is an integer max over the bits with
    the sign cleared (the order of non-negative floats; inf and NaN above every finite value): integer
    max reductions vectorise, float ones do not without giving up NaN."""
    lanes = x.shape[0]
    nb = dx.shape[1]
    if xq.shape[0] != lanes or dx.shape[0] != lanes or xq.shape[1] != nb * QB or cols > nb * QB or cols > x.shape[1]:
        raise ValueError("quantize_rows: shapes do not match")
    xi = x.view(np.int32)
    for lane in range(lanes):
        for blk in range(nb):
            o = blk * QB
            m = max(0, min(QB, cols - o))
            top = np.int32(0)
            for i in range(m):
                top = max(top, xi[lane, o + i] & np.int32(0x7FFFFFFF))
            if top >= np.int32(0x7F800000):  # inf or NaN
                dx[lane, blk] = np.float32(np.nan)
                for i in range(QB):
                    xq[lane, o + i] = 0
                continue
            d = np.float32(bits_f32(top) / np.float32(LIMIT))
            inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
            for i in range(m):
                xq[lane, o + i] = np.int16(np.rint(x[lane, o + i] * inv))
            for i in range(m, QB):
                xq[lane, o + i] = 0
            dx[lane, blk] = d


def _codegen(lanes: int) -> Callable:  # type: ignore[type-arg]
    def codegen(context, b, signature, args):  # type: ignore[no-untyped-def]
        wa, sa, xv, dv, lane_v, nblk, oa, os_, valid_v = args
        xarr = context.make_array(signature.args[2])(context, b, value=xv)
        darr = context.make_array(signature.args[3])(context, b, value=dv)
        xrows, drows = lane_rows(b, xarr, lane_v, lanes, darr)
        zero_i = ir.Constant(VI16, [0] * TILE)
        slots = [cgutils.alloca_once_value(b, ir.Constant(VF16, [0.0] * TILE)) for _ in range(lanes)]
        chains = max(1, 8 // lanes)  # independent int sums per lane: any order, the same integers
        wp, sp = b.inttoptr(wa, P8), b.inttoptr(sa, P8)
        with cgutils.for_range(b, nblk) as loop:
            blk = loop.index
            p = _at(b, wp, b.mul(blk, _c(BLOCK_BYTES)))
            for line in range(0, BLOCK_BYTES, 64):
                _prefetch(b, _at(b, p, line))
            sc = b.load(b.bitcast(_at(b, sp, b.mul(blk, _c(4 * TILE))), VF16.as_pointer()), align=4)
            ws = [_load(b, p, PAIR_BYTES * k, VI16) for k in range(TILE)]
            xb = b.mul(blk, _c(TILE))  # 16 int16 pairs per block
            accs = [[zero_i] * chains for _ in range(lanes)]
            for k in range(TILE):  # k outer, lanes inner: the lanes' dependency chains interleave
                for g in range(lanes):
                    xk = _splat(b, b.load(b.gep(xrows[g], [b.add(xb, _c(k))]), align=4), TILE)
                    accs[g][k % chains] = _dpwssd(b, accs[g][k % chains], ws[k], xk)
            for g in range(lanes):
                a = accs[g]
                while len(a) > 1:
                    a = [b.add(a[i], a[i + 1]) for i in range(0, len(a), 2)]
                dxg = _splat(b, b.load(b.gep(drows[g], [blk])), TILE)
                acc = _fma(b, b.sitofp(a[0], VF16), b.fmul(sc, dxg), b.load(slots[g]))
                b.store(acc, slots[g])
        _store_lanes(b, [b.load(s) for s in slots], oa, os_, valid_v)
        return context.get_dummy_value()

    return codegen


def _dot(lanes: int) -> Callable:  # type: ignore[type-arg]
    """Intrinsic `idot(vals_addr, scales_addr, xq, dx, lane, n_blocks, out_addr, out_stride, valid)`: one tile
    (raw addresses of its values and scales) against rows lane .. lane + lanes - 1 of xq (int16 [B, n],
    C-contiguous) with their block scales dx (float32 [B, n / 32]); row i of lane g goes to
    out_addr + g * out_stride + 4 i for i < valid."""

    def idot(typingctx, vals_addr, scales_addr, xq, dx, lane, n_blocks, out_addr, out_stride, valid):  # type: ignore[no-untyped-def]
        u = types.uint64
        return types.void(u, u, xq, dx, types.int64, types.int64, u, u, types.int64), _codegen(lanes)

    return intrinsic(idot)


idot8, idot4, idot1 = _dot(8), _dot(4), _dot(1)


@njit(nogil=True, cache=True)
def tile_products(vals, scales, rows, xq, dx, out):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """out[B, :rows] = x @ A.T for A in tiles (build_tiles) and x quantized per 32 values (xq int16 [B, n]
    C-contiguous, dx float32 [B, n / 32], n = 32 * blocks): serial; lanes in blocks of 64 (their int16 rows
    stay in L2 while the tiles pass), each tile meeting them 8, 4, 1 at a time."""
    nt, nb = vals.shape[0], vals.shape[1]
    lanes = xq.shape[0]
    if (xq.shape[1] != nb * QB or dx.shape[0] != lanes or dx.shape[1] != nb or out.shape[0] != lanes
            or out.shape[1] < rows or rows > nt * TILE or out.strides[1] != 4 or xq.strides[1] != 2
            or (lanes > 1 and xq.strides[0] != 2 * xq.shape[1]) or dx.strides[1] != 4
            or (lanes > 1 and dx.strides[0] != 4 * nb) or vals.strides[3] != 4 or scales.strides[2] != 4
            or vals.strides[0] != nb * BLOCK_BYTES or scales.strides[0] != nb * 4 * TILE):
        raise ValueError("tile_products: tiles, activations and output do not match")
    va, sa, oa = U(vals.ctypes.data), U(scales.ctypes.data), U(out.ctypes.data)
    vs, ss, os_ = U(vals.strides[0]), U(scales.strides[0]), U(out.strides[0])
    for l0 in range(0, lanes, 64):
        l1 = min(lanes, l0 + 64)
        for t in range(nt):
            valid = min(TILE, rows - t * TILE)
            if valid <= 0:
                break
            wt, st, ot = va + U(t) * vs, sa + U(t) * ss, oa + U(t * TILE * 4)
            g = l0
            while g + 8 <= l1:
                idot8(wt, st, xq, dx, g, nb, ot + U(g) * os_, os_, valid)
                g += 8
            if g + 4 <= l1:
                idot4(wt, st, xq, dx, g, nb, ot + U(g) * os_, os_, valid)
                g += 4
            while g < l1:
                idot1(wt, st, xq, dx, g, nb, ot + U(g) * os_, os_, valid)
                g += 1
