"""K/V cache element types: float32, float16 and bfloat16, and the kernels' loads and stores of them.

A pool's arrays hold the bits in a dtype numba can type, which also tells every kernel how to read them:
float32 as itself, float16 as uint16 (IEEE half bits), bfloat16 as int16 (the high half of a float32).
Numba has no CPU float16 type, so the kernels below are LLVM IR: a half row is loaded 32 values at a time and
widened with `fpext` (F16C's vcvtph2ps where the CPU has it), a bf16 row by a 16-bit shift; stores round to
nearest even, as numpy's astype(float16) does. Arithmetic stays float32: only the cache's bytes shrink. Every
sum runs in one fixed order whatever the element type (a score as one FMA chain over the dimensions on the key
tiles, P.V as blockdot.axpy_f32 row after row), so a half-width pool gives the bits of a float32 pool holding the
decoded values, and a row's bits do not depend on the batch.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.errors import EngineError
from engine.kernels.blockdot import F32, I32, I64, VF, W, _c, _fma, _hmax, _maxnum, _splat, fma1

KV_DTYPES = ("f32", "f16", "bf16")
# the storage dtype of each (what the pool's arrays are and what a kernel is compiled for)
_STORAGE = {"f32": np.dtype(np.float32), "f16": np.dtype(np.uint16), "bf16": np.dtype(np.int16)}
_NAMES = {v: k for k, v in _STORAGE.items()}
# how a KV frame's header names each (engine/wire/frame.py): numpy's names where numpy has the type
WIRE = {"f32": "<f4", "f16": "<f2", "bf16": "bf16"}
_FROM_WIRE = {w: _STORAGE[n] for n, w in WIRE.items()}
F16_MAX = 65504.0  # the largest finite half; larger values are stored as it, not as inf
I16 = ir.IntType(16)
HALF = ir.HalfType()


def storage(name: str) -> np.dtype:
    """The numpy dtype a pool of `name` elements holds (clear error for an unknown name)."""
    if name not in _STORAGE:
        raise EngineError(f"unknown KV dtype {name!r} (expected one of {', '.join(KV_DTYPES)})")
    return _STORAGE[name]


def name_of(dtype: np.dtype) -> str:
    """'f32' / 'f16' / 'bf16' for a pool's storage dtype."""
    return _NAMES[np.dtype(dtype)]


def wire_name(dtype: np.dtype) -> str:
    """The frame header's name of a pool's storage dtype ("<f4", "<f2", "bf16")."""
    return WIRE[name_of(dtype)]


def from_wire(wire: str) -> np.dtype:
    """The storage dtype a frame's K/V of `wire` are read as (KeyError: not a KV dtype)."""
    return _FROM_WIRE[wire]


def encode(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float32 values as `dtype` storage bits, rounded to nearest even."""
    x = np.asarray(x, dtype=np.float32)
    kind = name_of(dtype)
    if kind == "f32":
        return x
    if kind == "f16":  # saturated, as the kernels store it: an inf key would turn a softmax into NaN
        return np.clip(x, -F16_MAX, F16_MAX).astype(np.float16).view(np.uint16)
    bits = x.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded).view(np.int16)


def decode(a: np.ndarray) -> np.ndarray:
    """Storage bits back to float32 (a float32 array is returned as it is)."""
    kind = name_of(a.dtype)
    if kind == "f32":
        return a
    if kind == "f16":
        return a.view(np.float16).astype(np.float32)
    return (a.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _kind(like: types.Type) -> str:
    dt = getattr(like, "dtype", None)
    if dt == types.float32:
        return "f32"
    if dt == types.uint16:
        return "f16"
    if dt == types.int16:
        return "bf16"
    raise TypeError(f"K/V arrays must hold float32, uint16 (f16) or int16 (bf16), not {dt}")


def _widen(b: ir.IRBuilder, kind: str, base: ir.Value, idx: ir.Value, n: int) -> ir.Value:
    """n values of a K/V row at element idx of `base` (an i8* of the row) as <n x float>."""
    if kind == "f32":
        vt = ir.VectorType(F32, n)
        return b.load(b.bitcast(b.gep(b.bitcast(base, F32.as_pointer()), [idx]), vt.as_pointer()), align=4)
    vt = ir.VectorType(HALF if kind == "f16" else I16, n)
    raw = b.load(b.bitcast(b.gep(b.bitcast(base, I16.as_pointer()), [idx]), vt.as_pointer()), align=2)
    if kind == "f16":
        return b.fpext(raw, ir.VectorType(F32, n))
    i32 = ir.VectorType(I32, n)
    wide = b.shl(b.zext(raw, i32), ir.Constant(i32, [16] * n))
    return b.bitcast(wide, ir.VectorType(F32, n))


def _narrow(b: ir.IRBuilder, kind: str, x: ir.Value) -> ir.Value:
    """<n x float> (or a float) as the storage bits of `kind`, rounded to nearest even."""
    scalar = not isinstance(x.type, ir.VectorType)
    n = 1 if scalar else x.type.count

    def vec(t: ir.Type) -> ir.Type:
        return t if scalar else ir.VectorType(t, n)

    def const(t: ir.Type, v: int) -> ir.Constant:
        return ir.Constant(t, v) if scalar else ir.Constant(vec(t), [v] * n)

    if kind == "f16":  # saturate at the largest half (numpy's clip: NaN passes through)
        big = ir.Constant(F32, F16_MAX) if scalar else ir.Constant(vec(F32), [F16_MAX] * n)
        x = b.select(b.fcmp_ordered(">", x, big), big, x)
        x = b.select(b.fcmp_ordered("<", x, b.fneg(big)), b.fneg(big), x)
        return b.fptrunc(x, vec(HALF))
    bits = b.bitcast(x, vec(I32))
    lsb = b.and_(b.lshr(bits, const(I32, 16)), const(I32, 1))
    rounded = b.trunc(b.lshr(b.add(b.add(bits, const(I32, 0x7FFF)), lsb), const(I32, 16)), vec(I16))
    return b.select(b.fcmp_unordered("uno", x, x), const(I16, 0x7FC0), rounded)


@intrinsic
def kv_put(typingctx, like, dst_addr, src_addr, n):  # type: ignore[no-untyped-def]
    """dst[i] = src[i] for i < n: a float32 row at src_addr stored as like's element type at dst_addr
    (rounded to nearest even; a float32 pool is a plain copy)."""
    kind = _kind(like)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        b = builder
        ps = b.inttoptr(args[2], F32.as_pointer())
        pd = b.inttoptr(args[1], ir.IntType(8).as_pointer())
        n = args[3]
        et = F32 if kind == "f32" else (HALF if kind == "f16" else I16)
        pe = b.bitcast(pd, et.as_pointer())
        chunks = b.sdiv(n, _c(W))
        with cgutils.for_range(b, chunks) as loop:
            i0 = b.mul(loop.index, _c(W))
            x = b.load(b.bitcast(b.gep(ps, [i0]), VF.as_pointer()), align=4)
            y = x if kind == "f32" else _narrow(b, kind, x)
            b.store(y, b.bitcast(b.gep(pe, [i0]), ir.VectorType(et, W).as_pointer()), align=2)
        with cgutils.for_range_slice(b, b.mul(chunks, _c(W)), n, _c(1)) as (i, _):
            x = b.load(b.gep(ps, [i]))
            b.store(x if kind == "f32" else _narrow(b, kind, x), b.gep(pe, [i]))
        return context.get_dummy_value()

    return types.void(like, types.uint64, types.uint64, types.int64), codegen


@intrinsic
def kv_get(typingctx, like, dst_addr, src_addr, n):  # type: ignore[no-untyped-def]
    """dst[i] = src[i] for i < n: a row of like's element type at src_addr widened into float32 at dst_addr
    (exactly: every half and bf16 value is a float32 value), 32 at a time, then the tail."""
    kind = _kind(like)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        b = builder
        pd = b.inttoptr(args[1], F32.as_pointer())
        ps = b.inttoptr(args[2], ir.IntType(8).as_pointer())
        n = args[3]
        chunks = b.sdiv(n, _c(W))
        with cgutils.for_range(b, chunks) as loop:
            i0 = b.mul(loop.index, _c(W))
            b.store(_widen(b, kind, ps, i0, W), b.bitcast(b.gep(pd, [i0]), VF.as_pointer()), align=4)
        with cgutils.for_range_slice(b, b.mul(chunks, _c(W)), n, _c(1)) as (i, _):
            b.store(b.extract_element(_widen(b, kind, ps, i, 1), _c(0, I32)), b.gep(pd, [i]))
        return context.get_dummy_value()

    return types.void(like, types.uint64, types.uint64, types.int64), codegen


V16 = ir.VectorType(F32, 16)


def _acc_init(b: ir.IRBuilder, n: int) -> list[ir.Value]:
    accs = [cgutils.alloca_once(b, V16) for _ in range(n)]
    for a in accs:
        b.store(ir.Constant(V16, [0.0] * 16), a)
    return accs


def _kv_pvs(slots: int):  # type: ignore[no-untyped-def]
    @intrinsic
    def pvs(typingctx, like, p_addr, p_stride, count, rows_addr, n, dim, out_addr):  # type: ignore[no-untyped-def]
        """P.V for `count` (<= slots) heads over the same V rows (like's element type, at the addresses
        rows[j], uint64 [n]): out[i, d] = sum over j < n of p[i, j] * V_j[d], head i's weights the float32 row
        p_addr + i * p_stride floats [n], its output the float32 row out_addr + i * dim floats. Each out[i, d]
        is the chain fma(p[i, j], V_j[d], .) over j in order from 0, exactly as blockdot.axpy_f32 applied to the
        decoded rows one after another computes it. Each V row is widened once for every head, and the heads'
        accumulators (16 vectors of 16 lanes in registers) are independent chains: one head at a time was one
        chain of FMAs waiting on each other (4 cycles a position). Slots past count repeat the last head (not
        stored)."""
        kind = _kind(like)
        width = max(1, 16 // slots)  # 16-value vectors per head in a band: 16 accumulators in all

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            b = builder
            pp = b.inttoptr(args[1], F32.as_pointer())
            pstride, count = args[2], args[3]
            rp = b.inttoptr(args[4], I64.as_pointer())
            n, dim = args[5], args[6]
            po = b.inttoptr(args[7], F32.as_pointer())
            i8p = ir.IntType(8).as_pointer()
            last = b.sub(count, _c(1))
            heads = [b.select(b.icmp_signed("<", _c(i), count), _c(i), last) for i in range(slots)]
            prows = [b.gep(pp, [b.mul(h, pstride)]) for h in heads]
            orows = [b.gep(po, [b.mul(h, dim)]) for h in heads]

            def band(start: ir.Value, w: int) -> None:
                accs = [_acc_init(b, w) for _ in range(slots)]
                with cgutils.for_range(b, n) as loop:
                    row = b.inttoptr(b.load(b.gep(rp, [loop.index])), i8p)
                    xs = [_widen(b, kind, row, b.add(start, _c(16 * c)), 16) for c in range(w)]
                    for prow, head_accs in zip(prows, accs, strict=True):
                        a = _splat(b, b.load(b.gep(prow, [loop.index])), 16)
                        for x, acc in zip(xs, head_accs, strict=True):
                            b.store(_fma(b, a, x, b.load(acc)), acc)
                for i, (orow, head_accs) in enumerate(zip(orows, accs, strict=True)):
                    with b.if_then(b.icmp_signed("<", _c(i), count)):
                        for c, acc in enumerate(head_accs):
                            dst = b.bitcast(b.gep(orow, [b.add(start, _c(16 * c))]), V16.as_pointer())
                            b.store(b.load(acc), dst, align=4)

            wide = b.sdiv(dim, _c(16 * width))
            with cgutils.for_range(b, wide) as loop:
                band(b.mul(loop.index, _c(16 * width)), width)
            done = b.mul(wide, _c(16 * width))
            singles = b.sdiv(b.sub(dim, done), _c(16))
            with cgutils.for_range(b, singles) as loop:
                band(b.add(done, b.mul(loop.index, _c(16))), 1)
            done = b.add(done, b.mul(singles, _c(16)))
            with cgutils.for_range_slice(b, done, dim, _c(1)) as (d, _):
                for i, (prow, orow) in enumerate(zip(prows, orows, strict=True)):
                    acc = cgutils.alloca_once_value(b, ir.Constant(F32, 0.0))
                    with cgutils.for_range(b, n) as loop:
                        row = b.inttoptr(b.load(b.gep(rp, [loop.index])), i8p)
                        x = b.extract_element(_widen(b, kind, row, d, 1), _c(0, I32))
                        b.store(b.call(fma1(b), [b.load(b.gep(prow, [loop.index])), x, b.load(acc)]), acc)
                    with b.if_then(b.icmp_signed("<", _c(i), count)):
                        b.store(b.load(acc), b.gep(orow, [d]))
            return context.get_dummy_value()

        sig = types.void(like, types.uint64, types.int64, types.int64, types.uint64, types.int64, types.int64,
                         types.uint64)
        return sig, codegen

    return pvs


kv_pvs4 = _kv_pvs(4)
kv_pvs8 = _kv_pvs(8)


TILE_KEYS = 16  # positions a key tile holds: one 16-lane vector of scores per query vector and tile
TILE_BLOCK = 4  # key tiles the scores walk at once (times 2 query vectors: 8 independent FMA chains)


def _transpose16(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """16 vectors of 16 lanes transposed: stage s swaps bit s of the row index with bit s of the lane index
    between rows i and i + s, so after the four stages lane k of row i holds what was lane i of row k."""
    rows = list(rows)
    s = 1
    while s < 16:
        lo = [k if not k & s else 16 + k - s for k in range(16)]
        hi = [k + s if not k & s else 16 + k for k in range(16)]
        for i in range(16):
            if i & s:
                continue
            a, c = rows[i], rows[i + s]
            rows[i] = b.shuffle_vector(a, c, ir.Constant(ir.VectorType(I32, 16), lo))
            rows[i + s] = b.shuffle_vector(a, c, ir.Constant(ir.VectorType(I32, 16), hi))
        s *= 2
    return rows


@intrinsic
def kv_key_tiles(typingctx, like, rows_addr, n, dim, kt_addr):  # type: ignore[no-untyped-def]
    """The K rows at the addresses rows[j] (uint64 [n], like's element type) widened and transposed into key
    tiles: kt[t, d, i] = K_{16 t + i}[d] (float32, [ceil(n / 16), dim, 16] at kt_addr), so a query's scores
    against 16 positions are one vector FMA a dimension. Lanes past n repeat row 0 (their scores are
    junk the softmax never reads). 16 x 16 blocks go through _transpose16, the dim % 16 tail value by value."""
    kind = _kind(like)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        b = builder
        rp = b.inttoptr(args[1], I64.as_pointer())
        n, dim = args[2], args[3]
        kt = b.inttoptr(args[4], F32.as_pointer())
        i8p = ir.IntType(8).as_pointer()
        tiles = b.sdiv(b.add(n, _c(TILE_KEYS - 1)), _c(TILE_KEYS))
        blocks = b.sdiv(dim, _c(16))
        with cgutils.for_range(b, tiles) as tl:
            t = tl.index
            ptrs = []
            for i in range(TILE_KEYS):
                j = b.add(b.mul(t, _c(TILE_KEYS)), _c(i))
                j = b.select(b.icmp_signed("<", j, n), j, _c(0))
                ptrs.append(b.inttoptr(b.load(b.gep(rp, [j])), i8p))
            base = b.gep(kt, [b.mul(b.mul(t, dim), _c(TILE_KEYS))])
            with cgutils.for_range(b, blocks) as bl:
                d0 = b.mul(bl.index, _c(16))
                cols = _transpose16(b, [_widen(b, kind, p, d0, 16) for p in ptrs])
                for r, v in enumerate(cols):
                    dst = b.gep(base, [b.mul(b.add(d0, _c(r)), _c(TILE_KEYS))])
                    b.store(v, b.bitcast(dst, V16.as_pointer()), align=4)
            with cgutils.for_range_slice(b, b.mul(blocks, _c(16)), dim, _c(1)) as (d, _):
                for i, p in enumerate(ptrs):
                    x = b.extract_element(_widen(b, kind, p, d, 1), _c(0, I32))
                    b.store(x, b.gep(base, [b.add(b.mul(d, _c(TILE_KEYS)), _c(i))]))
        return context.get_dummy_value()

    return types.void(like, types.uint64, types.int64, types.int64, types.uint64), codegen


@intrinsic
def tile_scores(typingctx, kt_addr, n, dim, q_addr, count, scale, s_addr, s_stride, m_addr):  # type: ignore[no-untyped-def]
    """s[i * s_stride + j] = q_i . K_j for query vectors i < count (float32 rows of dim at q_addr, one after
    another) and positions j < 16 * TILE_BLOCK * ceil(n / (16 * TILE_BLOCK)), from the key tiles of
    kv_key_tiles (kt holds that many tiles; those past n hold anything, and so do their scores: the score
    rows must have room for them). Each score is the chain fma(q_i[d], K_j[d], .) over d in order from 0,
    then times `scale`, whichever query vectors and positions share the call: the bits of a score depend on
    nothing else. m[i] (float32 at m_addr) gets the largest of row i's n scores (exact in any order).
    Two query vectors x TILE_BLOCK tiles at a time: eight independent chains."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        b = builder
        kt = b.inttoptr(args[0], F32.as_pointer())
        n, dim = args[1], args[2]
        qp = b.inttoptr(args[3], F32.as_pointer())
        count = args[4]
        vscale = _splat(b, args[5], 16)
        sp = b.inttoptr(args[6], F32.as_pointer())
        sstride = args[7]
        mp = b.inttoptr(args[8], F32.as_pointer())
        ninf = ir.Constant(V16, [float("-inf")] * 16)
        lane = ir.Constant(ir.VectorType(I64, 16), list(range(16)))
        with cgutils.for_range(b, count) as ml:
            b.store(ir.Constant(F32, float("-inf")), b.gep(mp, [ml.index]))
        span = TILE_KEYS * TILE_BLOCK
        blocks = b.sdiv(b.add(n, _c(span - 1)), _c(span))
        pairs = b.sdiv(b.add(count, _c(1)), _c(2))
        last = b.sub(count, _c(1))
        with cgutils.for_range(b, blocks) as bl:
            tile0 = b.mul(bl.index, _c(TILE_BLOCK))
            tbase = [b.gep(kt, [b.mul(b.mul(b.add(tile0, _c(g)), dim), _c(TILE_KEYS))]) for g in range(TILE_BLOCK)]
            with cgutils.for_range(b, pairs) as pl:
                i0 = b.mul(pl.index, _c(2))
                vecs = [i0, b.select(b.icmp_signed("<", b.add(i0, _c(1)), count), b.add(i0, _c(1)), last)]
                qrows = [b.gep(qp, [b.mul(i, dim)]) for i in vecs]
                accs = [_acc_init(b, TILE_BLOCK) for _ in vecs]
                with cgutils.for_range(b, dim) as dl:
                    d = dl.index
                    ks = [b.load(b.bitcast(b.gep(tb, [b.mul(d, _c(TILE_KEYS))]), V16.as_pointer()), align=4)
                          for tb in tbase]
                    for qrow, row_accs in zip(qrows, accs, strict=True):
                        a = _splat(b, b.load(b.gep(qrow, [d])), 16)
                        for k, acc in zip(ks, row_accs, strict=True):
                            b.store(_fma(b, a, k, b.load(acc)), acc)
                for slot, (i, row_accs) in enumerate(zip(vecs, accs, strict=True)):
                    def put(i=i, row_accs=row_accs) -> None:  # type: ignore[no-untyped-def]
                        srow = b.gep(sp, [b.add(b.mul(i, sstride), b.mul(tile0, _c(TILE_KEYS)))])
                        top = ninf
                        for g, acc in enumerate(row_accs):
                            v = b.fmul(b.load(acc), vscale)
                            b.store(v, b.bitcast(b.gep(srow, [_c(g * TILE_KEYS)]), V16.as_pointer()), align=4)
                            first = b.mul(b.add(tile0, _c(g)), _c(TILE_KEYS))
                            left = b.sub(n, first)  # lanes at or past n are not scores
                            live = b.icmp_signed("<", lane, _splat(b, left, 16))
                            top = _maxnum(b, top, b.select(live, v, ninf))
                        mi = b.gep(mp, [i])
                        b.store(_maxnum(b, b.load(mi), _hmax(b, top)), mi)
                    if slot == 0:
                        put()
                    else:
                        with b.if_then(b.icmp_signed("<", b.add(i0, _c(1)), count)):
                            put()
        return context.get_dummy_value()

    sig = types.void(types.uint64, types.int64, types.int64, types.uint64, types.int64, types.float32, types.uint64,
                     types.int64, types.uint64)
    return sig, codegen
