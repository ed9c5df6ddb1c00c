"""Dot products of one GGUF-quantized weight row with one float32 activation row, in LLVM vector IR.

(Resident weights use these only under FAK_TILES=0; the default is the int16-dot tile kernels of
engine/kernels/tiledot.py, which also take `_fma`, `_splat`, `_prefetch` and friends from here. `dot_f32`
and `axpy_f32` serve the plain-weight product and attention.)

Why IR: numba's auto-vectoriser splits these block loops badly (256-bit lanes, accumulators kept in
memory, a horizontal sum per 32-value block; ~8 GB/s per core from L2). Written as numba intrinsics
on explicit `<32 x float>` values, each block is a handful of wide loads, conversions and FMAs, and
the accumulator stays in registers: ~16 GB/s per core from cache, so a GEMV is bound by memory, not
by unpacking. A software prefetch `PREFETCH_BYTES` ahead doubles what one core pulls from DRAM.

`dot1` / `dot4` / `dot8(kind, w_addr, x, lane, n_blocks, lut_addr, out_addr, out_stride)` dot one
weight row (raw address) with 1 / 4 / 8 rows of the activation array x from row `lane` on, and store
the sums. `gemm` (below) checks every shape and stride they rely on. The arithmetic is fixed by the
IR, not by compiler choices: `llvm.fma` per block into a 32-wide accumulator (lane i collects
positions i mod 32), then one fixed-order tree sum. So a row's result is the same bits whoever calls
it, for any batch size or thread count. `dot_f32` is the same idea for two float32 vectors (the
plain-weight product and attention's q.k). f16 block scales are decoded through a 65,536-entry float32 table (numba has no
float16 and not every CPU converts f16 in hardware).

Block layouts (ggml-common.h):
- Q8_0, 34 bytes / 32 values: f16 d, int8 q[32]; value = d * q.
- Q5_0, 22 bytes / 32 values: f16 d, u32 qh (5th bits), u8 qs[16] (value j: low nibble of qs[j],
  value j+16: high nibble); value = d * ((nibble | bit << 4) - 16).
- Q4_K, 144 bytes / 256 values: f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) for 8 sub-blocks,
  u8 qs[128]: bytes 32c..32c+31 hold sub-block 2c in the low nibbles, 2c+1 in the high ones;
  value = d * sc * q - dmin * m.
- Q6_K, 210 bytes / 256 values: u8 ql[128], u8 qh[64], int8 scales[16] (one per 16 values), f16 d;
  value = d * scale * (6-bit q - 32).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

W = 32  # values per block / sub-block, and the accumulator width
PREFETCH_BYTES = 4096  # measured on the LM head (262,144 x 640 Q8_0): 10.5 GB/s without, 19 GB/s at 2-16 KiB

F32 = ir.FloatType()
I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
P8 = I8.as_pointer()
VF = ir.VectorType(F32, W)
VB = ir.VectorType(I8, W)
VB16 = ir.VectorType(I8, 16)
VF16 = ir.VectorType(F32, 16)
ZERO = ir.Constant(VF, [0.0] * W)


def _c(v: int, t: ir.Type = I64) -> ir.Constant:
    return ir.Constant(t, v)


def _at(b: ir.IRBuilder, p: ir.Value, off: ir.Value | int) -> ir.Value:
    return b.gep(p, [off if isinstance(off, ir.Value) else _c(off)])


def _vload(b: ir.IRBuilder, p8: ir.Value, off: ir.Value | int, vt: ir.VectorType) -> ir.Value:
    return b.load(b.bitcast(_at(b, p8, off), vt.as_pointer()), align=1)


def _xload(b: ir.IRBuilder, xp: ir.Value, idx: ir.Value) -> ir.Value:
    """x[idx : idx + 32] as <32 x float>."""
    return b.load(b.bitcast(b.gep(xp, [idx]), VF.as_pointer()), align=4)


def _byte(b: ir.IRBuilder, p8: ir.Value, off: int, signed: bool = False) -> ir.Value:
    v = b.load(_at(b, p8, off))
    return b.sext(v, I32) if signed else b.zext(v, I32)


def _f16(b: ir.IRBuilder, p8: ir.Value, off: int, lut: ir.Value) -> ir.Value:
    idx = b.or_(_byte(b, p8, off), b.shl(_byte(b, p8, off + 1), _c(8, I32)))
    return b.load(b.gep(lut, [b.zext(idx, I64)]))


def _splat(b: ir.IRBuilder, v: ir.Value, n: int = W) -> ir.Value:
    vt = ir.VectorType(v.type, n)
    one = b.insert_element(ir.Constant(vt, ir.Undefined), v, _c(0, I32))
    return b.shuffle_vector(one, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(I32, n), [0] * n))


def _concat(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> ir.Value:
    n = lo.type.count
    return b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n))))


def _vconst(v: int, vt: ir.VectorType = VB) -> ir.Constant:
    return ir.Constant(vt, [v] * vt.count)


def _fma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, acc: ir.Value) -> ir.Value:
    t = x.type
    fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(t, [t, t, t]), f"llvm.fma.v{t.count}f32")
    return b.call(fn, [x, y, acc])


def fma1(b: ir.IRBuilder) -> ir.Function:
    """The scalar fma the tails use (one rounding, as the vector lanes have)."""
    return cgutils.get_or_insert_function(b.module, ir.FunctionType(F32, [F32, F32, F32]), "llvm.fma.f32")


def _prefetch(b: ir.IRBuilder, p8: ir.Value) -> None:
    fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(ir.VoidType(), [P8, I32, I32, I32]), "llvm.prefetch.p0i8")
    b.call(fn, [_at(b, p8, PREFETCH_BYTES), _c(0, I32), _c(3, I32), _c(1, I32)])  # read, keep in L1, data


def _hsum(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """Sum of a float vector in one fixed tree order (halves added pairwise)."""
    n = v.type.count
    while n > 1:
        h = n // 2
        lo = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, h), list(range(h))))
        hi = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, h), list(range(h, n))))
        v = b.fadd(lo, hi)
        n = h
    return b.extract_element(v, _c(0, I32))


def _maxnum(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """llvm.maxnum of two floats or two float vectors (NaN loses to a number)."""
    t = x.type
    name = f"llvm.maxnum.v{t.count}f32" if isinstance(t, ir.VectorType) else "llvm.maxnum.f32"
    return b.call(cgutils.get_or_insert_function(b.module, ir.FunctionType(t, [t, t]), name), [x, y])


def _hmax(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """Largest lane of a float vector: halves folded pairwise down to two lanes, then one scalar maxnum
    (max is exact, so the order is free)."""
    n = v.type.count
    while n > 2:
        h = n // 2
        lo = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, h), list(range(h))))
        hi = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, h), list(range(h, n))))
        v, n = _maxnum(b, lo, hi), h
    return _maxnum(b, b.extract_element(v, _c(0, I32)), b.extract_element(v, _c(1, I32)))


Unpack = Callable[[ir.IRBuilder, ir.Value, ir.Value], list[tuple[ir.Value, int]]]


def _row_dot(b: ir.IRBuilder, wa: ir.Value, xps: list[ir.Value], nb: ir.Value, lut: ir.Value, dsts: list[ir.Value],
             block_bytes: int, block_values: int, unpack: Unpack) -> None:
    """One weight row (n_blocks blocks at wa) against the activation rows at xps; lane g's sum is
    stored at dsts[g]. `unpack(b, p, lut)` turns the block at p into float32 weight vectors
    [(w, value offset)]; every lane then does acc = fma(w, x, acc) on them in the same order: a
    block is unpacked once for all lanes, and a lane's bits do not depend on how many there are."""
    wp = b.inttoptr(wa, P8)
    slots = [cgutils.alloca_once(b, VF) for _ in xps]  # entry block: LLVM keeps them in registers
    for s in slots:
        b.store(ZERO, s)
    with cgutils.for_range(b, nb) as loop:
        x0 = b.mul(loop.index, _c(block_values))
        accs = [b.load(s) for s in slots]
        p = _at(b, wp, b.mul(loop.index, _c(block_bytes)))
        _prefetch(b, p)
        for wv, off in unpack(b, p, lut):
            for g, xp in enumerate(xps):
                accs[g] = _fma(b, wv, _xload(b, xp, b.add(x0, _c(off))), accs[g])
        for s, acc in zip(slots, accs, strict=False):
            b.store(acc, s)
    for s, dst in zip(slots, dsts, strict=False):
        b.store(_hsum(b, b.load(s)), dst)


def _q8_0(b, p, lut):  # type: ignore[no-untyped-def]
    return [(b.fmul(b.sitofp(_vload(b, p, 2, VB), VF), _splat(b, _f16(b, p, 0, lut))), 0)]


def _q5_0(b, p, lut):  # type: ignore[no-untyped-def]
    qs = _vload(b, p, 6, VB16)
    q = _concat(b, b.and_(qs, _vconst(15, VB16)), b.lshr(qs, _vconst(4, VB16)))
    qh = b.load(b.bitcast(_at(b, p, 2), I32.as_pointer()), align=1)
    vi = ir.VectorType(I32, W)
    bits = b.and_(b.lshr(_splat(b, qh), ir.Constant(vi, list(range(W)))), ir.Constant(vi, [1] * W))
    q = b.sub(b.or_(q, b.shl(b.trunc(bits, VB), _vconst(4))), _vconst(16))
    return [(b.fmul(b.sitofp(q, VF), _splat(b, _f16(b, p, 0, lut))), 0)]


def _k4_scale_min(b: ir.IRBuilder, p: ir.Value, j: int) -> tuple[ir.Value, ir.Value]:
    """Q4_K's 6-bit (scale, min) of sub-block j (llama.cpp get_scale_min_k4), as int32."""
    s = lambda k: _byte(b, p, 4 + k)  # noqa: E731
    m63, m15 = _c(63, I32), _c(15, I32)
    if j < 4:
        return b.and_(s(j), m63), b.and_(s(j + 4), m63)
    sc = b.or_(b.and_(s(j + 4), m15), b.shl(b.lshr(s(j - 4), _c(6, I32)), _c(4, I32)))
    m = b.or_(b.lshr(s(j + 4), _c(4, I32)), b.shl(b.lshr(s(j), _c(6, I32)), _c(4, I32)))
    return sc, m


def _q4_k(b, p, lut):  # type: ignore[no-untyped-def]
    d, dmin = _f16(b, p, 0, lut), _f16(b, p, 2, lut)
    out = []
    for c in range(4):
        q = _vload(b, p, 16 + 32 * c, VB)
        for half, nib in enumerate((b.and_(q, _vconst(15)), b.lshr(q, _vconst(4)))):
            j = 2 * c + half
            sc, m = _k4_scale_min(b, p, j)
            scale = _splat(b, b.fmul(d, b.uitofp(sc, F32)))
            neg_min = _splat(b, b.fneg(b.fmul(dmin, b.uitofp(m, F32))))
            out.append((_fma(b, b.uitofp(nib, VF), scale, neg_min), 32 * j))  # d*sc*q - dmin*m
    return out


def _q6_k(b, p, lut):  # type: ignore[no-untyped-def]
    d = _f16(b, p, 208, lut)
    out = []
    for half in range(2):
        ql0, ql1 = _vload(b, p, 64 * half, VB), _vload(b, p, 64 * half + 32, VB)
        qh = _vload(b, p, 128 + 32 * half, VB)
        hi2 = lambda shift, qh=qh: b.shl(b.and_(b.lshr(qh, _vconst(shift)), _vconst(3)), _vconst(4))  # noqa: E731
        quads = (b.or_(b.and_(ql0, _vconst(15)), hi2(0)), b.or_(b.and_(ql1, _vconst(15)), hi2(2)),
                 b.or_(b.lshr(ql0, _vconst(4)), hi2(4)), b.or_(b.lshr(ql1, _vconst(4)), hi2(6)))
        for k, q in enumerate(quads):
            sc = 192 + 8 * half + 2 * k  # values 0..15 of this group use scales[sc], 16..31 scales[sc + 1]
            scale = _concat(b, _splat(b, b.fmul(d, b.sitofp(_byte(b, p, sc, True), F32)), 16),
                            _splat(b, b.fmul(d, b.sitofp(_byte(b, p, sc + 1, True), F32)), 16))
            out.append((b.fmul(b.sitofp(b.sub(q, _vconst(32)), VF), scale), 128 * half + 32 * k))
    return out


# (block bytes, values per block, unpacker) by KIND code (engine/quant/rows.py)
_KINDS = ((34, 32, _q8_0), (22, 32, _q5_0), (144, 256, _q4_k), (210, 256, _q6_k))


_BLOCK_BYTES = tuple(k[0] for k in _KINDS)
_BLOCK_VALUES = tuple(k[1] for k in _KINDS)


def _dot_lanes(lanes: int) -> Callable:  # type: ignore[type-arg]
    """Intrinsic `dot(kind, w_addr, x, lane, n_blocks, lut_addr, out_addr, out_stride)`: x is a
    C-contiguous float32 [B, n] array, passed as an array (not an address) so numba keeps it alive
    for as long as the dots run."""

    def dot(typingctx, kind, w_addr, x, lane, n_blocks, lut_addr, out_addr, out_stride):  # type: ignore[no-untyped-def]
        u = types.uint64
        sig = types.void(types.int64, u, x, types.int64, types.int64, u, u, u)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            kind_v, wa, xv, lane_v, nb, la, oa, os_ = args
            xarr = context.make_array(signature.args[2])(context, builder, value=xv)
            n = cgutils.unpack_tuple(builder, xarr.shape, 2)[1]
            xps = [builder.gep(xarr.data, [builder.mul(builder.add(lane_v, _c(g)), n)]) for g in range(lanes)]
            dsts = [builder.inttoptr(builder.add(oa, builder.mul(os_, _c(g))), F32.as_pointer()) for g in range(lanes)]
            lut = builder.inttoptr(la, F32.as_pointer())
            for code, (bb, bv, unpack) in enumerate(_KINDS):  # the branch is taken once per row
                with builder.if_then(builder.icmp_signed("==", kind_v, _c(code))):
                    _row_dot(builder, wa, xps, nb, lut, dsts, bb, bv, unpack)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(dot)


@intrinsic
def dot_f32(typingctx, a_addr, b_addr, n):  # type: ignore[no-untyped-def]
    """sum(a[i] * b[i] for i < n) over two float32 vectors at raw addresses, in one fixed order:
    32-wide FMAs over whole chunks of 32, the fixed tree sum, then the tail in sequence. (A
    reassociating fast-math loop leaves the order to the compiler, which may pick differently in
    the serial twin and the parallel kernel.)"""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        b = builder
        pa, pb = b.inttoptr(args[0], F32.as_pointer()), b.inttoptr(args[1], F32.as_pointer())
        n = args[2]
        acc = cgutils.alloca_once(b, VF)
        b.store(ZERO, acc)
        chunks = b.sdiv(n, _c(W))
        with cgutils.for_range(b, chunks) as loop:
            i0 = b.mul(loop.index, _c(W))
            b.store(_fma(b, _xload(b, pa, i0), _xload(b, pb, i0), b.load(acc)), acc)
        total = cgutils.alloca_once_value(b, _hsum(b, b.load(acc)))
        with cgutils.for_range_slice(b, b.mul(chunks, _c(W)), n, _c(1)) as (i, _):
            av, bv = b.load(b.gep(pa, [i])), b.load(b.gep(pb, [i]))
            b.store(b.call(fma1(b), [av, bv, b.load(total)]), total)
        return b.load(total)

    return types.float32(types.uint64, types.uint64, types.int64), codegen


@intrinsic
def axpy_f32(typingctx, a, x_addr, y_addr, n):  # type: ignore[no-untyped-def]
    """y[i] = fma(a, x[i], y[i]) for i < n over float32 vectors at raw addresses: elementwise, so
    the bits do not depend on how the loop is split; 32 lanes at a time, then the tail."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        b = builder
        av, n = args[0], args[3]
        px, py = b.inttoptr(args[1], F32.as_pointer()), b.inttoptr(args[2], F32.as_pointer())
        va = _splat(b, av)
        chunks = b.sdiv(n, _c(W))
        with cgutils.for_range(b, chunks) as loop:
            i0 = b.mul(loop.index, _c(W))
            yp = b.bitcast(b.gep(py, [i0]), VF.as_pointer())
            b.store(_fma(b, va, _xload(b, px, i0), b.load(yp, align=4)), yp, align=4)
        with cgutils.for_range_slice(b, b.mul(chunks, _c(W)), n, _c(1)) as (i, _):
            yp = b.gep(py, [i])
            b.store(b.call(fma1(b), [av, b.load(b.gep(px, [i])), b.load(yp)]), yp)
        return context.get_dummy_value()

    return types.void(types.float32, types.uint64, types.uint64, types.int64), codegen


@intrinsic
def f32_bits(typingctx, x):  # type: ignore[no-untyped-def]
    """A float32's bits as an int32 (a bit cast: no conversion)."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], I32)

    return types.int32(types.float32), codegen


@intrinsic
def bits_f32(typingctx, i):  # type: ignore[no-untyped-def]
    """An int32's bits as a float32 (f32_bits undone)."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], F32)

    return types.float32(types.int32), codegen


@intrinsic
def max_f32(typingctx, x_addr, n):  # type: ignore[no-untyped-def]
    """max(x[i] for i < n) of a float32 vector at a raw address (-inf when n = 0): 32 lanes of maxnum at a
    time, then the tail. numba's max() over a loop does not vectorise (it keeps Python's NaN order), which
    made the prefill softmax's max pass ten times its sum pass. max is exact, so the order is free."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        b = builder
        px, n = b.inttoptr(args[0], F32.as_pointer()), args[1]
        acc = cgutils.alloca_once_value(b, ir.Constant(VF, [float("-inf")] * W))
        chunks = b.sdiv(n, _c(W))
        with cgutils.for_range(b, chunks) as loop:
            b.store(_maxnum(b, b.load(acc), _xload(b, px, b.mul(loop.index, _c(W)))), acc)
        total = cgutils.alloca_once_value(b, _hmax(b, b.load(acc)))
        with cgutils.for_range_slice(b, b.mul(chunks, _c(W)), n, _c(1)) as (i, _):
            b.store(_maxnum(b, b.load(total), b.load(b.gep(px, [i]))), total)
        return b.load(total)

    return types.float32(types.uint64, types.int64), codegen


@intrinsic
def sum_f32(typingctx, x_addr, n):  # type: ignore[no-untyped-def]
    """sum(x[i] for i < n) of a float32 vector at a raw address, in one fixed order: lane i of a 32-wide
    accumulator adds positions i mod 32 in sequence, the lanes fold by the fixed tree (_hsum), then the tail
    adds in sequence. numba's `tot += x[j]` is one serial chain (4 cycles a value), which made the decode
    softmax's sum pass as dear as its q.k dots."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        b = builder
        px, n = b.inttoptr(args[0], F32.as_pointer()), args[1]
        acc = cgutils.alloca_once_value(b, ZERO)
        chunks = b.sdiv(n, _c(W))
        with cgutils.for_range(b, chunks) as loop:
            b.store(b.fadd(b.load(acc), _xload(b, px, b.mul(loop.index, _c(W)))), acc)
        total = cgutils.alloca_once_value(b, _hsum(b, b.load(acc)))
        with cgutils.for_range_slice(b, b.mul(chunks, _c(W)), n, _c(1)) as (i, _):
            b.store(b.fadd(b.load(total), b.load(b.gep(px, [i]))), total)
        return b.load(total)

    return types.float32(types.uint64, types.int64), codegen


@intrinsic
def prefetch_ahead(typingctx, addr):  # type: ignore[no-untyped-def]
    """Software prefetch of the line PREFETCH_BYTES past `addr` (what the block loops do)."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        _prefetch(builder, builder.inttoptr(args[0], P8))
        return context.get_dummy_value()

    return types.void(types.uint64), codegen


# Lane groups: 8 accumulators (16 zmm) + an unpacked block fit the 32 vector registers of AVX-512;
# every group size gives each lane the same bits, so gemm mixes them freely.
dot1 = _dot_lanes(1)
dot4 = _dot_lanes(4)
dot8 = _dot_lanes(8)  # (tiles of 2 rows x 4 lanes: no faster, measured on the LM head at B = 4 / 8 / 16)
U = np.uint64  # unsigned indices and addresses: no negative-index fix-ups in the loops
ROW_TILE = 32


@njit(parallel=True, nogil=True, cache=True)
def gemm(w, x, out, lut, kind):  # type: ignore[no-untyped-def]
    """out[B, rows] = x[B, n] @ W.T for the quantized rows of w (kind: a KIND code), parallel over rows.

    A tile of ROW_TILE rows meets one lane group (8, 4 or 1 lanes) at a time, so the group's
    activations stay in L1 (both groups of 16 lanes per row: 13% slower, measured on the LM head).
    x is first copied to a 64-byte aligned buffer (a 64-byte load across two cache lines costs two:
    measured 1.8x at B=16)."""
    rows, row_bytes = w.shape
    lanes, n = x.shape
    if kind < 0 or kind > 3:
        raise ValueError("gemm: weight, activation and output shapes do not match")
    bs = _BLOCK_VALUES[kind]
    nb = n // bs
    # the block dots read raw addresses: every size and stride they rely on is checked here
    if (nb * bs != n or nb * _BLOCK_BYTES[kind] != row_bytes or out.shape[0] != lanes or out.shape[1] != rows
            or w.strides[1] != 1 or out.strides[1] != 4 or lut.shape[0] != 65536 or lut.strides[0] != 4):
        raise ValueError("gemm: weight, activation and output shapes do not match")
    buf = np.empty(lanes * n + 16, dtype=np.float32)
    skip = ((64 - buf.ctypes.data % 64) % 64) // 4
    xal = buf[skip: skip + lanes * n].reshape((lanes, n))
    xal[:] = x
    wa, la, oa = U(w.ctypes.data), U(lut.ctypes.data), U(out.ctypes.data)
    ws, os_ = U(w.strides[0]), U(out.strides[0])
    nc = min(rows, 64)
    for c in prange(nc):
        lo, hi = c * rows // nc, (c + 1) * rows // nc
        for r0 in range(lo, hi, ROW_TILE):  # a tile of rows per lane group: its x rows stay in L1
            r1 = min(hi, r0 + ROW_TILE)
            b = 0
            while b + 8 <= lanes:
                for r in range(r0, r1):
                    dot8(kind, wa + U(r) * ws, xal, b, nb, la, oa + U(r) * U(4) + U(b) * os_, os_)
                b += 8
            if b + 4 <= lanes:
                for r in range(r0, r1):
                    dot4(kind, wa + U(r) * ws, xal, b, nb, la, oa + U(r) * U(4) + U(b) * os_, os_)
                b += 4
            while b < lanes:
                for r in range(r0, r1):
                    dot1(kind, wa + U(r) * ws, xal, b, nb, la, oa + U(r) * U(4) + U(b) * os_, os_)
                b += 1
