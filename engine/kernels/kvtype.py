"""K/V cache element types: float32, float16 and bfloat16, and the kernels' loads and stores of them.

A pool's arrays hold the bits in a dtype numba can type, which also tells every kernel how to read them:
float32 as itself, float16 as uint16 (IEEE half bits), bfloat16 as int16 (the high half of a float32).
Numba has no CPU float16 type, so the kernels below are LLVM IR: a half row is loaded 32 values at a time and
widened with `fpext` (F16C's vcvtph2ps where the CPU has it), a bf16 row by a 16-bit shift; stores round to
nearest even, as numpy's astype(float16) does. Arithmetic stays float32: only the cache's bytes shrink. Every
sum runs in one fixed order whatever the element type (the grouped dots' fixed tree, P.V as blockdot.axpy_f32
row after row), so a half-width pool gives the bits of a float32 pool holding the decoded values, and a row's
bits do not depend on the batch.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.errors import EngineError
from engine.kernels.blockdot import F32, I32, I64, VF, W, _c, _fma, _splat, fma1

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


@intrinsic
def kv_pv(typingctx, like, p_addr, rows_addr, n, dim, out_addr):  # type: ignore[no-untyped-def]
    """out[d] = sum over j < n of p[j] * V_j[d], for d < dim: p float32 [n], V_j the row (like's element type)
    at the address rows[j] (uint64 [n]). Each out[d] is the chain fma(p[j], V_j[d], .) over j in order from 0,
    exactly as blockdot.axpy_f32 applied to the decoded rows one after another computes it, but with the
    outputs in registers across the rows: 64 values (4 x 16) at a time, then 16, then one by one."""
    kind = _kind(like)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        b = builder
        pp = b.inttoptr(args[1], F32.as_pointer())
        rp = b.inttoptr(args[2], I64.as_pointer())
        n, dim = args[3], args[4]
        po = b.inttoptr(args[5], F32.as_pointer())
        i8p = ir.IntType(8).as_pointer()

        def band(start: ir.Value, width: int) -> None:
            """out[start : start + 16 * width], width accumulators of 16 across all rows."""
            accs = _acc_init(b, width)
            with cgutils.for_range(b, n) as loop:
                a = _splat(b, b.load(b.gep(pp, [loop.index])), 16)
                row = b.inttoptr(b.load(b.gep(rp, [loop.index])), i8p)
                for c, acc in enumerate(accs):
                    x = _widen(b, kind, row, b.add(start, _c(16 * c)), 16)
                    b.store(_fma(b, a, x, b.load(acc)), acc)
            for c, acc in enumerate(accs):
                dst = b.bitcast(b.gep(po, [b.add(start, _c(16 * c))]), V16.as_pointer())
                b.store(b.load(acc), dst, align=4)

        wide = b.sdiv(dim, _c(64))
        with cgutils.for_range(b, wide) as loop:
            band(b.mul(loop.index, _c(64)), 4)
        done = b.mul(wide, _c(64))
        singles = b.sdiv(b.sub(dim, done), _c(16))
        with cgutils.for_range(b, singles) as loop:
            band(b.add(done, b.mul(loop.index, _c(16))), 1)
        done = b.add(done, b.mul(singles, _c(16)))
        with cgutils.for_range_slice(b, done, dim, _c(1)) as (d, _):
            acc = cgutils.alloca_once_value(b, ir.Constant(F32, 0.0))
            with cgutils.for_range(b, n) as loop:
                row = b.inttoptr(b.load(b.gep(rp, [loop.index])), i8p)
                x = b.extract_element(_widen(b, kind, row, d, 1), _c(0, I32))
                b.store(b.call(fma1(b), [b.load(b.gep(pp, [loop.index])), x, b.load(acc)]), acc)
            b.store(b.load(acc), b.gep(po, [d]))
        return context.get_dummy_value()

    return types.void(like, types.uint64, types.uint64, types.int64, types.int64, types.uint64), codegen


def _pairs(b: ir.IRBuilder, vs: list[ir.Value], width: int) -> list[ir.Value]:
    """One level of the reduction tree: vectors holding `width` partial sums per head become vectors holding
    width / 2 per head, heads of two neighbours side by side (lo halves + hi halves of each head's run)."""
    out = []
    n = vs[0].type.count
    half = width // 2
    lo = [h * width + i for h in range(n // width) for i in range(half)]
    hi = [h * width + half + i for h in range(n // width) for i in range(half)]
    for x, y in zip(vs[0::2], vs[1::2], strict=True):
        idx_lo = lo + [n + i for i in lo]
        idx_hi = hi + [n + i for i in hi]
        a = b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, n), idx_lo))
        c = b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, n), idx_hi))
        out.append(b.fadd(a, c))
    return out


def _kv_dots(slots: int):  # type: ignore[no-untyped-def]
    @intrinsic
    def dots(typingctx, like, q_addr, k_addr, dim, count, out_addr, out_stride):  # type: ignore[no-untyped-def]
        """out[i * out_stride] = q_i . k for i < count (<= slots; the stride in floats): the query heads q_i
        (float32 rows of dim at q_addr) against one K row (like's element type) at k_addr, read once for all
        heads. Each head sums 16 lanes across the row, then the heads' lanes are reduced together (a
        transposing tree: one shuffle pair and add per level for all heads, not one tree per head), then the
        dim % 16 tail in sequence. Slots past count repeat the last head (their sums are dropped). A fixed
        order: the same bits for a head whatever the batch."""
        kind = _kind(like)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            b = builder
            qp = b.inttoptr(args[1], F32.as_pointer())
            kp = b.inttoptr(args[2], ir.IntType(8).as_pointer())
            dim, count = args[3], args[4]
            op = b.inttoptr(args[5], F32.as_pointer())
            ostride = args[6]
            last = b.sub(count, _c(1))
            qs = []
            for i in range(slots):
                head = b.select(b.icmp_signed("<", _c(i), count), _c(i), last)
                qs.append(b.gep(qp, [b.mul(head, dim)]))
            accs = _acc_init(b, slots)
            chunks = b.sdiv(dim, _c(16))
            with cgutils.for_range(b, chunks) as loop:
                i0 = b.mul(loop.index, _c(16))
                k = _widen(b, kind, kp, i0, 16)
                for q, acc in zip(qs, accs, strict=True):
                    qv = b.load(b.bitcast(b.gep(q, [i0]), V16.as_pointer()), align=4)
                    b.store(_fma(b, qv, k, b.load(acc)), acc)
            vs = [b.load(a) for a in accs]
            width = 16
            while len(vs) > 1:
                vs = _pairs(b, vs, width)
                width //= 2
            v = vs[0]  # `slots` heads x `width` partial sums each, in one 16-lane vector
            while width > 1:
                n = v.type.count
                half = width // 2
                heads = n // width
                lo = [h * width + i for h in range(heads) for i in range(half)]
                hi = [h * width + half + i for h in range(heads) for i in range(half)]
                v = b.fadd(b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, len(lo)), lo)),
                           b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, len(hi)), hi)))
                width = half
            tail0 = b.mul(chunks, _c(16))
            for i, q in enumerate(qs):
                tot = cgutils.alloca_once_value(b, b.extract_element(v, _c(i, I32)))
                with cgutils.for_range_slice(b, tail0, dim, _c(1)) as (d, _):
                    kd = b.extract_element(_widen(b, kind, kp, d, 1), _c(0, I32))
                    b.store(b.call(fma1(b), [b.load(b.gep(q, [d])), kd, b.load(tot)]), tot)
                with b.if_then(b.icmp_signed("<", _c(i), count)):
                    b.store(b.load(tot), b.gep(op, [b.mul(_c(i), ostride)]))
            return context.get_dummy_value()

        sig = types.void(like, types.uint64, types.uint64, types.int64, types.int64, types.uint64, types.int64)
        return sig, codegen

    return dots


kv_dots4 = _kv_dots(4)
kv_dots8 = _kv_dots(8)
