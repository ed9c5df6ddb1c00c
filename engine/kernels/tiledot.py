"""Tiled quantized weights against int16 activations: the decode product on integer dot instructions.

Why: a float32 FMA does 16 multiply-adds per instruction, so at 16 lanes the block dot of
engine/kernels/blockdot.py is bound by the FMA ports, not by memory. `vpdpwssd` (AVX-512 VNNI) does 32
int16 multiply-adds per instruction at the same rate (measured: 3.0-5.5 G instr/s per core for
both, side by side). Activations are quantized per 32 values to int16 (scale = max|x| / 32767): on
Gemma 3 270M the logits move by at most 0.002 against float32 (int8, llama.cpp's q8_0, moves them
by 0.53; the bound is 0.05). Integer sums are exact, so a lane's bits do not depend on the batch
size, the thread count or which lane group ran it.

Weights are in 16-row tiles (engine/quant/tiles.py): one 32-byte vector holds values 2k, 2k+1 of
all 16 rows, so against a broadcast activation pair one `vpdpwssd` adds into the 16 rows' int32
sums. Per 32-value tile block and lane: the exact int sum I over 16 pairs (two halves for Q6_K's
per-16 scales), then acc = fma(float(I), scale * dx, acc) (Q4_K also acc += -dmin*m * dx*sum(xq)):
blocks in order, so the float part is fixed too. The kernels are IR (numba intrinsics) for the
same reasons as blockdot's. Q4_1 / Q5_1 (value d*q + m) add m * dx*sum(xq) the same way.

F16 / BF16 tiles hold floats: against the float32 activations, vector j of a tile block (value j
of the 16 rows, widened to float32) meets a broadcast x[j] in one FMA, into F_CHAINS accumulators
per lane (j mod F_CHAINS; the same for every lane group) summed in a fixed order at the end, so a
lane's bits do not depend on the batch either.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils, errors
from numba.extending import intrinsic

from engine.kernels.blockdot import F32, I8, I32, P8, VF16, _at, _c, _fma, _prefetch, _splat
from engine.quant.tiles import FLOAT_KINDS, HBITS, HEADER, KINDS, NIB, OFFSET, QB, SB_BYTES, SB_VALUES, TB_BYTES, TILE

X_MAX = 32767.0  # int16 activation range

VI16 = ir.VectorType(I32, TILE)
VB32 = ir.VectorType(I8, QB)
VW32 = ir.VectorType(ir.IntType(16), QB)
VH16 = ir.VectorType(ir.HalfType(), TILE)
VB16 = ir.VectorType(I8, TILE)
VF32 = ir.VectorType(F32, QB)
VH16I = ir.VectorType(ir.IntType(16), TILE)  # a 32-byte vector as 16 words


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


# ---- per-kind pieces: header, tile-block scales, the 16 pair vectors ------------------------------


def _load(b: ir.IRBuilder, p: ir.Value, off: int, vt: ir.VectorType) -> ir.Value:
    return b.load(b.bitcast(_at(b, p, off), vt.as_pointer()), align=1)


def _f16x16(b: ir.IRBuilder, p: ir.Value, off: int) -> ir.Value:
    return b.fpext(_load(b, p, off, VH16), VF16)


def _bytes_f(b: ir.IRBuilder, p: ir.Value, off: int, signed: bool) -> ir.Value:
    v = _load(b, p, off, VB16)
    return b.sitofp(b.sext(v, VI16), VF16) if signed else b.uitofp(b.zext(v, VI16), VF16)


def _vc(v: int) -> ir.Constant:
    return ir.Constant(VB32, [v] * QB)


MIN_SUB = (2, 7)  # Q4_K, Q5_K: value = d*sc*q - dmin*m
MIN_ADD = (5, 6)  # Q4_1, Q5_1: value = d*q + m
F_CHAINS = 2  # float tiles: accumulators per lane (fixed: the lane group size must not change a lane's bits)


def _header(kind: int, b: ir.IRBuilder, psb: ir.Value) -> list[ir.Value]:
    if kind in MIN_SUB:
        return [_f16x16(b, psb, 0), _f16x16(b, psb, 32)]  # d, dmin
    if kind == 3:
        return [_f16x16(b, psb, 0)]  # d
    return []


def _scales(kind: int, b: ir.IRBuilder, p: ir.Value, hdr: list[ir.Value]) -> list[ir.Value]:
    """Per-row float vectors a tile block needs (shared by every lane)."""
    if kind in (0, 1, 4):
        return [_f16x16(b, p, 0)]  # d
    if kind in MIN_ADD:
        return [_f16x16(b, p, 0), _f16x16(b, p, 32)]  # d, m
    if kind in MIN_SUB:
        return [b.fmul(hdr[0], _bytes_f(b, p, 0, False)), b.fmul(hdr[1], _bytes_f(b, p, 16, False))]  # d*sc, dmin*m
    return [b.fmul(hdr[0], _bytes_f(b, p, 0, True)), b.fmul(hdr[0], _bytes_f(b, p, 16, True))]  # d*sc, two halves


def _pairs(kind: int, b: ir.IRBuilder, p: ir.Value) -> list[ir.Value]:
    """The tile block's 16 pair vectors as <32 x i8> signed values."""
    if kind == 0:
        return [_load(b, p, 32 + QB * k, VB32) for k in range(TILE)]
    nib = [_load(b, p, NIB[kind] + QB * g, VB32) for g in range(8)]
    out = []
    for k in range(TILE):
        v = b.and_(nib[k], _vc(15)) if k < 8 else b.lshr(nib[k - 8], _vc(4))
        bits = HBITS[kind]
        if bits:  # the high bits above the nibble
            per = 8 // bits
            hv = _load(b, p, NIB[kind] + 256 + QB * (k // per), VB32)
            # the field sits at bit `at` of every byte: one 16-bit shift brings it to bit 4 (x86 has no
            # byte shift: an i8 shift is a word shift + a mask, twice here) and one mask keeps it; bits a
            # word shift carries across a byte boundary land outside the mask. The same integers.
            at = bits * (k % per)
            w16 = b.bitcast(hv, VH16I)
            if at < 4:
                w16 = b.shl(w16, ir.Constant(VH16I, [4 - at] * TILE))
            elif at > 4:
                w16 = b.lshr(w16, ir.Constant(VH16I, [at - 4] * TILE))
            v = b.or_(v, b.and_(b.bitcast(w16, VB32), _vc(((1 << bits) - 1) << 4)))
        if OFFSET[kind]:
            v = b.sub(v, _vc(OFFSET[kind]))
        out.append(v)
    return out


def _sb_loop(kind: int, b: ir.IRBuilder, wp: ir.Value, nsb: ir.Value, body: Callable) -> None:  # type: ignore[type-arg]
    """body(p, blk, hdr) for every tile block in order: its address, its index among the row's
    32-value blocks, and its super-block's header vectors."""
    tbs = SB_VALUES[kind] // QB
    with cgutils.for_range(b, nsb) as sb:
        psb = _at(b, wp, b.mul(sb.index, _c(SB_BYTES[kind])))
        hdr = _header(kind, b, psb)
        base = _at(b, psb, HEADER[kind])
        with cgutils.for_range(b, _c(tbs)) as j:
            p = _at(b, base, b.mul(j.index, _c(TB_BYTES[kind])))
            body(p, b.add(b.mul(sb.index, _c(tbs)), j.index), hdr)


def _tile_sig(xq, dx, sxd, xf):  # type: ignore[no-untyped-def]
    u = types.uint64
    return types.void(u, xq, dx, sxd, xf, types.int64, types.int64, u, u, types.int64)


def _store_lanes(b: ir.IRBuilder, accs: list[ir.Value], oa: ir.Value, os_: ir.Value, valid_v: ir.Value) -> None:
    """Lane g's 16 row sums to out_addr + g * out_stride: one vector store, or the first `valid`."""
    full = b.icmp_signed("==", valid_v, _c(TILE))
    for g, acc in enumerate(accs):
        dst = b.inttoptr(b.add(oa, b.mul(os_, _c(g))), F32.as_pointer())
        with b.if_else(full) as (whole, part):
            with whole:
                b.store(acc, b.bitcast(dst, VF16.as_pointer()), align=4)
            with part:
                for i in range(TILE):
                    with b.if_then(b.icmp_signed("<", _c(i), valid_v)):
                        b.store(b.extract_element(acc, _c(i, I32)), b.gep(dst, [_c(i)]))


def _fvec(kind: int, b: ir.IRBuilder, p: ir.Value, off: int) -> ir.Value:
    """Float tiles: the 16 rows' value at byte offset off of a tile block, as <16 x float>."""
    if kind == FLOAT_KINDS:  # F16
        return _f16x16(b, p, off)
    bits = b.zext(_load(b, p, off, ir.VectorType(ir.IntType(16), TILE)), VI16)  # BF16: the high half
    return b.bitcast(b.shl(bits, ir.Constant(VI16, [16] * TILE)), VF16)


def _ftile_codegen(kind: int, lanes: int) -> Callable:  # type: ignore[type-arg]
    def codegen(context, b, signature, args):  # type: ignore[no-untyped-def]
        wa, _, _, _, fv, lane_v, nsb, oa, os_, valid_v = args
        farr = context.make_array(signature.args[4])(context, b, value=fv)
        n = cgutils.unpack_tuple(b, farr.shape, 2)[1]
        frows = [b.gep(farr.data, [b.mul(b.add(lane_v, _c(g)), n)]) for g in range(lanes)]
        zero = ir.Constant(VF16, [0.0] * TILE)
        slots = [[cgutils.alloca_once_value(b, zero) for _ in range(F_CHAINS)] for _ in range(lanes)]

        def body(p, blk, hdr):  # type: ignore[no-untyped-def]
            for line in range(0, TB_BYTES[kind], 64):
                _prefetch(b, _at(b, p, line))
            x0 = b.mul(blk, _c(QB))
            accs = [[b.load(s) for s in lane] for lane in slots]
            for j in range(QB):
                w = _fvec(kind, b, p, 2 * TILE * j)
                for g in range(lanes):
                    xj = _splat(b, b.load(b.gep(frows[g], [b.add(x0, _c(j))])), TILE)
                    accs[g][j % F_CHAINS] = _fma(b, w, xj, accs[g][j % F_CHAINS])
            for lane, acc in zip(slots, accs, strict=False):
                for s_, a in zip(lane, acc, strict=False):
                    b.store(a, s_)

        _sb_loop(kind, b, b.inttoptr(wa, P8), nsb, body)
        sums = []
        for lane in slots:
            a = [b.load(s_) for s_ in lane]
            while len(a) > 1:
                a = [b.fadd(a[i], a[i + 1]) for i in range(0, len(a), 2)]
            sums.append(a[0])
        _store_lanes(b, sums, oa, os_, valid_v)
        return context.get_dummy_value()

    return codegen


def lane_rows(b: ir.IRBuilder, xarr: Any, lane_v: ir.Value, lanes: int, *per_block: Any) -> list[list[ir.Value]]:
    """Where lanes lane_v .. lane_v + lanes - 1 start: in xarr (int16 [B, n], as int32 pairs) and in each
    per-block array (float32 [B, n / 32]: the scales dx, dx * sum(xq))."""
    n = cgutils.unpack_tuple(b, xarr.shape, 2)[1]
    x32 = b.bitcast(xarr.data, I32.as_pointer())  # int16 pairs
    rows = [b.add(lane_v, _c(g)) for g in range(lanes)]
    out = [[b.gep(x32, [b.sdiv(b.mul(r, n), _c(2))]) for r in rows]]
    for arr in per_block:
        nbx = cgutils.unpack_tuple(b, arr.shape, 2)[1]
        out.append([b.gep(arr.data, [b.mul(r, nbx)]) for r in rows])
    return out


def _tile_codegen(kind: int, lanes: int) -> Callable:  # type: ignore[type-arg]
    if kind >= FLOAT_KINDS:
        return _ftile_codegen(kind, lanes)
    n_int = 2 if kind == 3 else 1  # int sums per lane and tile block (Q6_K: one per 16 values)

    def codegen(context, b, signature, args):  # type: ignore[no-untyped-def]
        wa, xv, dv, sv, _, lane_v, nsb, oa, os_, valid_v = args
        xarr = context.make_array(signature.args[1])(context, b, value=xv)
        darr = context.make_array(signature.args[2])(context, b, value=dv)
        sarr = context.make_array(signature.args[3])(context, b, value=sv)
        xrows, drows, srows = lane_rows(b, xarr, lane_v, lanes, darr, sarr)
        zero_i = ir.Constant(VI16, [0] * TILE)
        slots = [cgutils.alloca_once_value(b, ir.Constant(VF16, [0.0] * TILE)) for _ in range(lanes)]
        chains = max(1, 8 // (lanes * n_int))  # independent sums per lane: int adds, any order

        def body(p, blk, hdr):  # type: ignore[no-untyped-def]
            for line in range(0, TB_BYTES[kind], 64):  # every line of the tile block, ahead
                _prefetch(b, _at(b, p, line))
            sc = _scales(kind, b, p, hdr)
            ws = [b.bitcast(b.sext(v, VW32), VI16) for v in _pairs(kind, b, p)]
            xb = b.mul(blk, _c(TILE))  # 16 int16 pairs per block
            # k outer, lanes inner: the lanes' dependency chains interleave in program order,
            # so the out-of-order window need not reach across lanes to hide vpdpwssd's latency
            accs = [[[zero_i] * chains for _ in range(n_int)] for _ in range(lanes)]
            for k in range(TILE):
                grp = k * n_int // TILE
                for g in range(lanes):
                    xk = _splat(b, b.load(b.gep(xrows[g], [b.add(xb, _c(k))]), align=4), TILE)
                    a = accs[g][grp]
                    a[k % chains] = _dpwssd(b, a[k % chains], ws[k], xk)
            for g in range(lanes):
                dxg = _splat(b, b.load(b.gep(drows[g], [blk])), TILE)
                acc = b.load(slots[g])
                for grp in range(n_int):
                    a = accs[g][grp]
                    while len(a) > 1:
                        a = [b.add(a[i], a[i + 1]) for i in range(0, len(a), 2)]
                    scale = sc[grp] if kind == 3 else sc[0]
                    acc = _fma(b, b.sitofp(a[0], VF16), b.fmul(scale, dxg), acc)
                if kind in MIN_SUB or kind in MIN_ADD:  # -+ min * sum(x) over the block
                    sx = b.load(b.gep(srows[g], [blk]))
                    sx = _splat(b, b.fneg(sx) if kind in MIN_SUB else sx, TILE)
                    acc = _fma(b, sc[1], sx, acc)
                b.store(acc, slots[g])

        _sb_loop(kind, b, b.inttoptr(wa, P8), nsb, body)
        _store_lanes(b, [b.load(s_) for s_ in slots], oa, os_, valid_v)
        return context.get_dummy_value()

    return codegen


def _by_kind(codegen_of: Callable, tag: str) -> Callable:  # type: ignore[type-arg]
    """Codegen taking a literal kind mask and a run-time kind first and calling that kind's body behind
    a branch (taken once per tile): numba cannot pick one of several intrinsics by a run-time value.
    Only the kinds in the mask get a body (a kind outside it does nothing: the kernels check it first).
    Each body is its own (internal, not inlined) LLVM function: optimizing ten bodies apart costs LLVM
    far less than one function holding them all (cold compile of the tile kernels measured 65 s -> 36 s;
    the call, once per tile, costs nothing measurable)."""

    def codegen(context, b, signature, args):  # type: ignore[no-untyped-def]
        mask = signature.args[0].literal_value
        inner = types.void(*signature.args[2:])
        mod = b.module
        argtys = [a.type for a in args[2:]]
        for code in range(len(KINDS)):
            if not mask >> code & 1:
                continue
            sig = zlib.crc32(f"{argtys} {HAS_VNNI}".encode())  # one body per argument types and ISA
            name = f"fak_{tag}_{KINDS[code]}_{sig:08x}"
            fn = mod.globals.get(name)
            if fn is None:
                fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), argtys), name=name)
                fn.linkage = "internal"
                fn.attributes.add("noinline")
                fb = ir.IRBuilder(fn.append_basic_block("entry"))
                codegen_of(code)(context, fb, inner, list(fn.args))
                fb.ret_void()
            with b.if_then(b.icmp_signed("==", args[1], _c(code))):
                b.call(fn, args[2:])
        return context.get_dummy_value()

    return codegen


def _kinds_mask(kinds: types.Type) -> types.IntegerLiteral:
    """The `kinds` argument's type: a literal bit mask of kind codes (tiles.KIND_GROUPS, ALL_KINDS)."""
    if not isinstance(kinds, types.IntegerLiteral) or not 0 < kinds.literal_value < 1 << len(KINDS):
        raise errors.TypingError(f"the tile kinds must be a literal bit mask of kind codes, not {kinds}")
    return kinds


def _tile_any(lanes: int) -> Callable:  # type: ignore[type-arg]
    """Intrinsic `tdot(kinds, kind, w_addr, xq, dx, sxd, xf, lane, n_super, out_addr, out_stride, valid)`: one
    tile of 16 rows (raw address) against lanes lane .. lane + lanes - 1 of xq (int16 [B, n]), with the
    block scales dx and dx * sum(xq) (float32 [B, n / 32]), or (float tiles) of xf (float32 [B, n]); row i of lane g goes to
    out_addr + g * out_stride + 4 i for i < valid. The arrays are passed as arrays so numba keeps
    them alive while the dots run."""

    def tdot(typingctx, kinds, kind, w_addr, xq, dx, sxd, xf, lane, n_super, out_addr,  # type: ignore[no-untyped-def]
             out_stride, valid):
        return (types.void(_kinds_mask(kinds), types.int64, *_tile_sig(xq, dx, sxd, xf).args),
                _by_kind(lambda k: _tile_codegen(k, lanes), f"tdot{lanes}"))

    return intrinsic(prefer_literal=True)(tdot)


def _dq_codegen(kind: int) -> Callable:  # type: ignore[type-arg]
    def codegen(context, b, signature, args):  # type: ignore[no-untyped-def]
        wa, nsb, ov, row0_v = args
        oarr = context.make_array(signature.args[2])(context, b, value=ov)
        nrows, ncols = cgutils.unpack_tuple(b, oarr.shape, 2)
        v2 = ir.VectorType(F32, 2)
        dup = ir.Constant(ir.VectorType(I32, QB), [i // 2 for i in range(QB)])  # a pair's values share a row

        def fbody(p, blk, hdr):  # type: ignore[no-untyped-def]
            for j in range(QB):
                f = _fvec(kind, b, p, 2 * TILE * j)
                col = b.add(b.mul(blk, _c(QB)), _c(j))
                for i in range(TILE):
                    row = b.add(row0_v, _c(i))
                    with b.if_then(b.icmp_signed("<", row, nrows), likely=True):
                        b.store(b.extract_element(f, _c(i, I32)), b.gep(oarr.data, [b.add(b.mul(row, ncols), col)]))

        def body(p, blk, hdr):  # type: ignore[no-untyped-def]
            sc = [b.shuffle_vector(s, s, dup) for s in _scales(kind, b, p, hdr)]
            for k, q in enumerate(_pairs(kind, b, p)):
                f = b.fmul(b.sitofp(q, VF32), sc[1] if kind == 3 and k >= 8 else sc[0])
                if kind in MIN_SUB:
                    f = b.fsub(f, sc[1])
                elif kind in MIN_ADD:
                    f = b.fadd(f, sc[1])
                col = b.add(b.mul(blk, _c(QB)), _c(2 * k))
                for i in range(TILE):
                    row = b.add(row0_v, _c(i))
                    with b.if_then(b.icmp_signed("<", row, nrows), likely=True):
                        dst = b.gep(oarr.data, [b.add(b.mul(row, ncols), col)])
                        pair = b.shuffle_vector(f, f, ir.Constant(ir.VectorType(I32, 2), [2 * i, 2 * i + 1]))
                        b.store(pair, b.bitcast(dst, v2.as_pointer()), align=4)

        _sb_loop(kind, b, b.inttoptr(wa, P8), nsb, fbody if kind >= FLOAT_KINDS else body)
        return context.get_dummy_value()

    return codegen


@intrinsic(prefer_literal=True)
def dq_tile(typingctx, kinds, kind, w_addr, n_super, out, row0):  # type: ignore[no-untyped-def]
    """Intrinsic `dq_tile(kinds, kind, w_addr, n_super, out, row0)`: the tile at w_addr as float32 rows
    row0.. of out ([R, n]; rows past R are padding, skipped). Each value is what gguf.quants.dequantize gives
    (the same float32 products in the same order); the pair layout is transposed on the way out:
    each row's two values of a pair are one 8-byte store."""
    return (types.void(_kinds_mask(kinds), types.int64, types.uint64, types.int64, out, types.int64),
            _by_kind(_dq_codegen, "dq"))


# lane groups of 8, 4, 2 and 1, the mask's kinds behind a run-time branch (taken once per tile). A lane's
# bits are the same in any group. (Measured and not kept: 16-lane groups, two tiles per pass, two
# sums per lane at 8 lanes, embedded-broadcast operands: no gain beyond this box's run-to-run noise.)
tdot8 = _tile_any(8)
tdot4 = _tile_any(4)
tdot2 = _tile_any(2)
tdot1 = _tile_any(1)
