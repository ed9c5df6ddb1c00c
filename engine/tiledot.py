"""Q8_0 weights in 16-row tiles against int16 activations: the batched decode product on integer dots.

Why: a float32 FMA does 16 multiply-adds per instruction, so at 16 lanes the block dot of
engine/blockdot.py is bound by the FMA ports, not by memory. `vpdpwssd` (AVX-512 VNNI) does 32
int16 multiply-adds per instruction at the same rate (measured: 3.0-3.1 G instr/s per core for
both). Activations are quantized per 32-value block to int16 (scale = max|x| / 32767): on Gemma 3
270M that moves the logits by at most 0.0024 against float32 (int8, llama.cpp's q8_0, moves them
by 0.53; the bound is 0.05). Every integer sum is exact, so a lane's bits still do not depend on
the batch size, the thread count or which lane group ran it.

The tile layout ("Q8_0x16"): the rows of a Q8_0 weight in tiles of TILE = 16 (the last tile padded
with zero rows), each tile one row of the repacked array [n_tiles, n_blocks * TILE_BLOCK]. Tile
block b (TILE_BLOCK = 544 bytes, the same 34 bytes per row and block as Q8_0):
- bytes 0..31: the 16 rows' f16 scales d;
- bytes 32 + 32k + 2i + j (k < 16, i < 16, j < 2): q[row i, 32b + 2k + j] (int8).
So one 32-byte load, sign-extended to 32 int16, is "values 2k, 2k+1 of all 16 rows": against a
broadcast pair of activations, one `vpdpwssd` adds them into the 16 rows' int32 sums.

Per tile block and lane: sum_i = sum_k dpwssd(W_k, x pair k) (exact int32), then
acc_i = fma(float(sum_i), d_i * dx_b, acc_i): blocks in order, so the float part is fixed too.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.blockdot import F32, I8, I32, P8, U, VF16, _at, _c, _fma, _prefetch, _splat

TILE = 16  # rows per tile: one zmm of int32 row sums
QB = 32  # values per block
TILE_BLOCK = 2 * TILE + TILE * QB  # 544 bytes
X_MAX = 32767.0  # int16 activation range

VI16 = ir.VectorType(I32, TILE)
VB32 = ir.VectorType(I8, QB)
VW32 = ir.VectorType(ir.IntType(16), QB)
VH16 = ir.VectorType(ir.HalfType(), TILE)


def _has_vnni() -> bool:
    try:
        llvm.initialize_native_target()
        llvm.initialize_native_asmparser()  # for the inline asm below (numba does not load it)
        return bool(llvm.get_host_cpu_features().get("avx512vnni", False))
    except Exception:  # noqa: BLE001  (no feature query: take the portable form)
        return False


HAS_VNNI = _has_vnni()


def _dpwssd(b: ir.IRBuilder, acc: ir.Value, w: ir.Value, x: ir.Value) -> ir.Value:
    """acc + pairwise int16 products of w and x summed into int32 lanes (exact, no saturation)."""
    if HAS_VNNI:
        # inline asm, not the llvm.x86 intrinsic: LLVM's machine combiner splits an intrinsic chain
        # back into vpmaddwd + vpaddd (shorter latency, twice the vector uops: measured 1.5x slower)
        asm = ir.InlineAsm(ir.FunctionType(VI16, [VI16] * 3), "vpdpwssd $3, $2, $0", "=v,0,v,v")
        return b.call(asm, [acc, w, x])
    # the same integers without VNNI (LLVM selects vpmaddwd + vpaddd where it can)
    wide = ir.VectorType(I32, 2 * TILE)
    p = b.mul(b.sext(b.bitcast(w, VW32), wide), b.sext(b.bitcast(x, VW32), wide))
    even = b.shuffle_vector(p, p, ir.Constant(VI16, list(range(0, 2 * TILE, 2))))
    odd = b.shuffle_vector(p, p, ir.Constant(VI16, list(range(1, 2 * TILE, 2))))
    return b.add(acc, b.add(even, odd))


def _tile_lanes(lanes: int) -> Callable:  # type: ignore[type-arg]
    """Intrinsic `tdot(w_addr, xq, dx, lane, n_blocks, out_addr, out_stride, valid)`: one tile of
    16 rows (raw address) against lanes `lane..lane+lanes-1` of xq (int16 [B, n]) with block
    scales dx (float32 [B, n / 32]); row i of lane g goes to out_addr + g * out_stride + 4 i for
    i < valid. Both arrays are passed as arrays so numba keeps them alive while the dots run."""

    def tdot(typingctx, w_addr, xq, dx, lane, n_blocks, out_addr, out_stride, valid):  # type: ignore[no-untyped-def]
        u = types.uint64
        sig = types.void(u, xq, dx, types.int64, types.int64, u, u, types.int64)

        def codegen(context, b, signature, args):  # type: ignore[no-untyped-def]
            wa, xv, dv, lane_v, nb, oa, os_, valid_v = args
            xarr = context.make_array(signature.args[1])(context, b, value=xv)
            darr = context.make_array(signature.args[2])(context, b, value=dv)
            n = cgutils.unpack_tuple(b, xarr.shape, 2)[1]
            nbx = cgutils.unpack_tuple(b, darr.shape, 2)[1]
            x32 = b.bitcast(xarr.data, I32.as_pointer())  # int16 pairs
            xrows = [b.gep(x32, [b.sdiv(b.mul(b.add(lane_v, _c(g)), n), _c(2))]) for g in range(lanes)]
            drows = [b.gep(darr.data, [b.mul(b.add(lane_v, _c(g)), nbx)]) for g in range(lanes)]
            wp = b.inttoptr(wa, P8)
            zero_f = ir.Constant(VF16, [0.0] * TILE)
            zero_i = ir.Constant(VI16, [0] * TILE)
            slots = [cgutils.alloca_once(b, VF16) for _ in range(lanes)]
            for s in slots:
                b.store(zero_f, s)
            with cgutils.for_range(b, nb) as loop:
                blk = loop.index
                p = _at(b, wp, b.mul(blk, _c(TILE_BLOCK)))
                for line in range(0, TILE_BLOCK, 64):  # every line of the tile block
                    _prefetch(b, _at(b, p, line))
                d = b.fpext(b.load(b.bitcast(p, VH16.as_pointer()), align=1), VF16)
                ws = [b.bitcast(b.sext(b.load(b.bitcast(_at(b, p, 2 * TILE + QB * k), VB32.as_pointer()), align=1), VW32), VI16)
                      for k in range(TILE)]
                xb = b.mul(blk, _c(TILE))  # 16 int16 pairs per block
                # k outer, lanes inner: the lanes' dependency chains interleave in program order, so
                # the out-of-order window need not reach across lanes to hide vpdpwssd's latency
                chains = 8 // lanes if lanes < 8 else 1  # independent sums per lane: int adds, any order
                accs = [[zero_i] * chains for _ in range(lanes)]
                for k in range(TILE):
                    for g in range(lanes):
                        xk = _splat(b, b.load(b.gep(xrows[g], [b.add(xb, _c(k))]), align=4), TILE)
                        accs[g][k % chains] = _dpwssd(b, accs[g][k % chains], ws[k], xk)
                for g in range(lanes):
                    a = accs[g]
                    while len(a) > 1:
                        a = [b.add(a[i], a[i + 1]) for i in range(0, len(a), 2)]
                    scale = b.fmul(d, _splat(b, b.load(b.gep(drows[g], [blk])), TILE))
                    b.store(_fma(b, b.sitofp(a[0], VF16), scale, b.load(slots[g])), slots[g])
            full = b.icmp_signed("==", valid_v, _c(TILE))
            for g in range(lanes):
                dst = b.inttoptr(b.add(oa, b.mul(os_, _c(g))), F32.as_pointer())
                acc = b.load(slots[g])
                with b.if_else(full) as (whole, part):
                    with whole:
                        b.store(acc, b.bitcast(dst, VF16.as_pointer()), align=4)
                    with part:
                        for i in range(TILE):
                            with b.if_then(b.icmp_signed("<", _c(i), valid_v)):
                                b.store(b.extract_element(acc, _c(i, I32)), b.gep(dst, [_c(i)]))
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(tdot)


tdot1 = _tile_lanes(1)
tdot4 = _tile_lanes(4)
tdot8 = _tile_lanes(8)  # 16 unpacked weight vectors + 8 accumulators: within the 32 zmm registers


@intrinsic
def dq_tile(typingctx, w_addr, n_blocks, out, row0):  # type: ignore[no-untyped-def]
    """Tile at w_addr dequantized into rows row0.. of out (float32 [R, n_blocks * 32]; rows past R
    are the padding, skipped). One block: 16 wide loads, conversions and multiplies, then each
    row's two values of a pair as one 8-byte store (the layout's transpose, done on the way out)."""

    def codegen(context, b, signature, args):  # type: ignore[no-untyped-def]
        wa, nb, ov, row0_v = args
        oarr = context.make_array(signature.args[2])(context, b, value=ov)
        nrows, ncols = cgutils.unpack_tuple(b, oarr.shape, 2)
        wp = b.inttoptr(wa, P8)
        v32 = ir.VectorType(F32, QB)
        v2 = ir.VectorType(F32, 2)
        pairs = ir.Constant(ir.VectorType(I32, QB), [i // 2 for i in range(QB)])
        with cgutils.for_range(b, nb) as loop:
            p = _at(b, wp, b.mul(loop.index, _c(TILE_BLOCK)))
            d = b.fpext(b.load(b.bitcast(p, VH16.as_pointer()), align=1), VF16)
            dd = b.shuffle_vector(d, d, pairs)  # d0 d0 d1 d1 ...: a pair's two values share a row
            for k in range(TILE):
                q = b.load(b.bitcast(_at(b, p, 2 * TILE + QB * k), VB32.as_pointer()), align=1)
                f = b.fmul(b.sitofp(q, v32), dd)
                col = b.add(b.mul(loop.index, _c(QB)), _c(2 * k))
                for i in range(TILE):
                    row = b.add(row0_v, _c(i))
                    with b.if_then(b.icmp_signed("<", row, nrows), likely=True):
                        dst = b.gep(oarr.data, [b.add(b.mul(row, ncols), col)])
                        pair = b.shuffle_vector(f, f, ir.Constant(ir.VectorType(I32, 2), [2 * i, 2 * i + 1]))
                        b.store(pair, b.bitcast(dst, v2.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(types.uint64, types.int64, out, types.int64), codegen


@njit(parallel=True, cache=True)
def dq_tile_range(w, t0, out):  # type: ignore[no-untyped-def]
    """Tiles t0, t0 + 1, ... of a Q8_0x16 weight as float32 rows out[0:], out[16:], ... (out is
    C-contiguous [R, n]; its last tile may be partial): the prefill path's dequantized tiles."""
    rows, n = out.shape
    nb = n // QB
    nt = (rows + TILE - 1) // TILE
    if nb * QB != n or nb * TILE_BLOCK != w.shape[1] or t0 < 0 or t0 + nt > w.shape[0] or w.strides[1] != 1:
        raise ValueError("dq_tile_range: weight and output shapes do not match")
    if not out.flags.c_contiguous:
        raise ValueError("dq_tile_range: output must be C-contiguous")
    wa, ws = U(w.ctypes.data), U(w.strides[0])
    for j in prange(nt):
        dq_tile(wa + U(t0 + j) * ws, nb, out, j * TILE)


@njit(inline="always", cache=True)
def quantize_rows_i16(x, xq, dx):  # type: ignore[no-untyped-def]
    """x float32 [B, n] -> xq int16 [B, n] and dx float32 [B, n / 32], x ~ xq * dx per block:
    dx = max|x| / 32767, xq = rint(x / dx). A block holding inf or NaN gets dx = NaN, so the
    product is NaN as the float product would be."""
    lanes, n = x.shape
    for lane in range(lanes):
        for blk in range(n // QB):
            o = blk * QB
            amax = np.float32(0.0)
            for i in range(QB):
                amax = max(amax, abs(x[lane, o + i]))
            d = np.float32(amax / np.float32(X_MAX))
            if not np.isfinite(amax):
                dx[lane, blk] = np.float32(np.nan)
                for i in range(QB):
                    xq[lane, o + i] = 0
                continue
            dx[lane, blk] = d
            inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
            for i in range(QB):
                xq[lane, o + i] = np.int16(np.rint(x[lane, o + i] * inv))


@njit(parallel=True, cache=True)
def gemm_tiles(w, x, out):  # type: ignore[no-untyped-def]
    """out[B, rows] = x[B, n] @ W.T for a Q8_0x16 weight w [n_tiles, n_blocks * 544], parallel over tiles."""
    ntiles, tile_bytes = w.shape
    lanes, n = x.shape
    rows = out.shape[1]
    nb = n // QB
    # the tile dots read raw addresses: every size and stride they rely on is checked here
    if (nb * QB != n or nb * TILE_BLOCK != tile_bytes or out.shape[0] != lanes or rows > ntiles * TILE
            or rows <= (ntiles - 1) * TILE or w.strides[1] != 1 or out.strides[1] != 4):
        raise ValueError("gemm_tiles: weight, activation and output shapes do not match")
    buf = np.empty(lanes * n + 32, dtype=np.int16)  # 64-byte aligned: a block's 32 int16 = one line
    skip = ((64 - buf.ctypes.data % 64) % 64) // 2
    xq = buf[skip: skip + lanes * n].reshape((lanes, n))
    dx = np.empty((lanes, nb), dtype=np.float32)
    quantize_rows_i16(x, xq, dx)
    wa, oa = U(w.ctypes.data), U(out.ctypes.data)
    ws, os_ = U(w.strides[0]), U(out.strides[0])
    nc = min(ntiles, 64)
    for c in prange(nc):
        for t in range(c * ntiles // nc, (c + 1) * ntiles // nc):
            valid = min(TILE, rows - t * TILE)
            wt, ot = wa + U(t) * ws, oa + U(t * TILE * 4)
            b = 0
            while b + 8 <= lanes:
                tdot8(wt, xq, dx, b, nb, ot + U(b) * os_, os_, valid)
                b += 8
            if b + 4 <= lanes:
                tdot4(wt, xq, dx, b, nb, ot + U(b) * os_, os_, valid)
                b += 4
            while b < lanes:
                tdot1(wt, xq, dx, b, nb, ot + U(b) * os_, os_, valid)
                b += 1


@njit(parallel=True, cache=True)
def repack_q8_0_tiles(src, dst):  # type: ignore[no-untyped-def]
    """Q8_0 rows src [rows, nb * 34] -> tiles dst [ceil(rows / 16), nb * 544] (padding rows zero)."""
    rows = src.shape[0]
    nb = src.shape[1] // 34
    if dst.shape[0] != (rows + TILE - 1) // TILE or dst.shape[1] != nb * TILE_BLOCK or nb * 34 != src.shape[1]:
        raise ValueError("repack_q8_0_tiles: source and destination shapes do not match")
    for t in prange(dst.shape[0]):
        for i in range(TILE):
            r = t * TILE + i
            for blk in range(nb):
                o, s = blk * TILE_BLOCK, blk * 34
                if r >= rows:
                    dst[t, o + 2 * i] = 0
                    dst[t, o + 2 * i + 1] = 0
                    for k in range(QB // 2):
                        dst[t, o + 2 * TILE + QB * k + 2 * i] = 0
                        dst[t, o + 2 * TILE + QB * k + 2 * i + 1] = 0
                    continue
                dst[t, o + 2 * i] = src[r, s]
                dst[t, o + 2 * i + 1] = src[r, s + 1]
                for k in range(QB // 2):
                    dst[t, o + 2 * TILE + QB * k + 2 * i] = src[r, s + 2 + 2 * k]
                    dst[t, o + 2 * TILE + QB * k + 2 * i + 1] = src[r, s + 3 + 2 * k]


@njit(parallel=True, cache=True)
def dq_rows_q8_0x16(w, rows, out, lut, qk):  # type: ignore[no-untyped-def]
    """Rows `rows` of a Q8_0x16 weight as float32 (same signature as kernels.DQ_ROWS)."""
    nb = out.shape[1] // qk
    for j in prange(rows.shape[0]):
        t, i = rows[j] // TILE, rows[j] % TILE
        for blk in range(nb):
            o = blk * TILE_BLOCK
            d = lut[np.int64(w[t, o + 2 * i]) | (np.int64(w[t, o + 2 * i + 1]) << 8)]
            for k in range(qk // 2):
                for h in range(2):
                    v = np.int32(w[t, o + 2 * TILE + qk * k + 2 * i + h])
                    out[j, blk * qk + 2 * k + h] = np.float32(v - ((v & 128) << 1)) * d
