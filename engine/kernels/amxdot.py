"""The tile product on AMX (Sapphire Rapids and later): 16 lanes against a 16-row weight tile per instruction pair.

Why: at 16 rows and more a decode step (and every prefill chunk) is bound by the integer dot unit, not by
memory. In engine/kernels/tiledot.py's tile dot `vpdpwssd` retires about once a cycle (3.7 G/s a core
measured on a 2-core Xeon: 117 G multiply-adds/s); AMX's TDPBSSD does a 16x16x64 int8 block in ~16 cycles
(3.0 T multiply-adds/s a core measured on the same host).

The same integers, so the same bits: AMX multiplies bytes, the activations are int16. Each is split,
xq = 256 * hi + lo (hi signed, lo unsigned; `split_row`), and a block's two products, TDPBSSD (hi x w)
and TDPBUSD (lo x w), give 256 * C_hi + C_lo: the exact int32 sum vpdpwssd gives (|C_hi| <= 32 * 128 * 128,
so the shift cannot overflow). The float part per 32-value block is tiledot's, the same operations in the
same order (acc = fma(float(I), scale * dx, acc), then the min term), so a lane's logits are the same bits
whichever path ran it, and a batch may mix the two (16-lane groups here, the rest on vpdpwssd).

Per call: a weight tile (16 rows) is unpacked once (tiledot's pair vectors, interleaved into AMX's B layout:
8 rows of 64 bytes, row k holding values 4k..4k+3 of each weight row, beside the block's scale vectors) into
the worker's scratch; then every 16-lane group meets it block by block: A is the group's block of the split
activations (1 KiB, `split_row`), two products, the two result tiles stored and read back by the vector
epilogue (one block behind the products, result tiles alternating). Tiles: tmm0 C_hi, tmm1 C_lo (16 x 64 B),
tmm2 A_hi, tmm3 A_lo (16 x 32 B), tmm4 B (8 x 64 B). A block costs ~140 cycles at best on the host measured:
the tile unit and the vector units did not overlap in a microbenchmark (products and stores ~75, epilogue ~50),
so a tile meets AMX only when two or more groups share its unpacking (tilegemm.AMX_MIN_LANES).

Kinds: one int sum per 32-value block (Q8_0, Q5_0, Q4_K, Q4_0, Q4_1, Q5_1, Q5_K). Q6_K (a scale per 16
values) and the float tiles stay on vpdpwssd / FMA.

Linux gives a process the AMX state only on request (arch_prctl ARCH_REQ_XCOMP_PERM); `amx_ready()` asks
once. FAK_AMX=0 turns the path off (A/B runs); so does a CPU or kernel without it.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.blockdot import I8, I32, I64, P8, VF16, _c
from engine.kernels.tiledot import MIN_ADD, MIN_SUB, _by_kind, _pairs, _sb_loop, _scales, _store_lanes
from engine.quant.tiles import QB, SB_BYTES, SB_VALUES, TILE

LANES = 16  # lanes per AMX pass: the 16 rows of A and of C
AMX_KINDS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7)  # one int sum a block
C_BYTES = TILE * 64  # one 16 x 16 int32 result tile
B_BYTES = 8 * 64  # a block's weights in B layout
_ARCH_GET_XCOMP_PERM, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1022, 0x1023, 18, 158

VH16W = ir.VectorType(ir.IntType(16), TILE)  # a pair vector as 16 words (one a weight row)
VB64W = ir.VectorType(ir.IntType(16), 2 * TILE)  # a B row: 16 dwords as 32 words


@functools.cache
def amx_ready() -> bool:
    """True when this process may run AMX int8 tiles: the CPU has them, the kernel granted the tile state,
    and FAK_AMX is not 0."""
    if os.environ.get("FAK_AMX", "1") == "0":
        return False
    try:
        llvm.initialize_native_target()
        feats = llvm.get_host_cpu_features()
        if not (feats.get("amx-int8", False) and feats.get("amx-tile", False)):
            return False
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0:
            return False
        mask = ctypes.c_uint64(0)
        if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) != 0:
            return False
        return bool(mask.value >> _XFEATURE_XTILEDATA & 1)
    except Exception:  # noqa: BLE001  (no feature query, no syscall: the vpdpwssd path)
        return False


@njit(inline="always", cache=True)
def split_row(xq, xpk, j):  # type: ignore[no-untyped-def]
    """Lane row xq int16 [n] into slot j of its group's blocks, xpk int8 [n / 32, 16, 64]: per block, bytes
    0..31 hi (signed) and 32..63 lo (unsigned, stored as the same bits) with xq = 256 * hi + lo. A block's
    16 lanes are 1 KiB in one place: its two A tiles load with a 64-byte stride (at the row's own stride
    they crossed 16 rows of the activations, 2.5x slower at n = 4864)."""
    for blk in range(xpk.shape[0]):
        o = np.uint64(blk * QB)
        for i in range(QB):
            v = np.int32(xq[o + np.uint64(i)])
            xpk[blk, j, i] = np.int8(v >> 8)
            xpk[blk, j, QB + i] = np.int8(((v & 255) ^ 128) - 128)  # the low byte's bits as int8


def _config(b: ir.IRBuilder) -> ir.Value:
    """The tile configuration (palette 1; rows and bytes a row of tmm0..tmm4) as a 64-byte constant."""
    cfg = bytearray(64)
    cfg[0] = 1
    for t, (rows, colsb) in enumerate(((TILE, 64), (TILE, 64), (TILE, QB), (TILE, QB), (8, 64))):
        cfg[16 + 2 * t: 18 + 2 * t] = colsb.to_bytes(2, "little")
        cfg[48 + t] = rows
    mod = b.module
    g = mod.globals.get("fak_amx_tilecfg")
    if g is None:
        ty = ir.ArrayType(I8, 64)
        g = ir.GlobalVariable(mod, ty, name="fak_amx_tilecfg")
        g.initializer = ir.Constant(ty, bytearray(cfg))
        g.global_constant = True
        g.linkage = "internal"
        g.align = 64
    return b.ptrtoint(g, I64)


def _asm(b: ir.IRBuilder, text: str, args: list[ir.Value]) -> None:
    fn = ir.FunctionType(ir.VoidType(), [a.type for a in args])
    b.call(ir.InlineAsm(fn, text, ",".join(["r"] * len(args) + ["~{memory}"]), side_effect=True), args)


BLOCK_SHARE = tuple(sb // (v // QB) for sb, v in zip(SB_BYTES, SB_VALUES, strict=True))  # tile bytes a block
SLOT = B_BYTES + 2 * 64  # a block in the scratch: its B rows, then its two scale vectors


@njit(inline="always", cache=True)
def scratch_bytes(n: int) -> int:
    """Bytes of the scratch `tdot16x` needs for rows of n values (64-byte alignment included)."""
    return (n // QB) * SLOT + 2 * 2 * C_BYTES + 64


def _epilogue(b: ir.IRBuilder, kind: int, n_sc: int, slot: ir.Value, cbuf: ir.Value, dxb: ir.Value,
              sxb: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
    """Block results into the 16 lanes' sums: tiledot's float step, the same operations in the same order
    (acc = fma(float(256 * C_hi + C_lo), scale * dx, acc), then the min term), one instruction sequence a lane
    (written out: left to LLVM, all 16 sums were loaded first and spilled). dxb, sxb: the block's 16 lanes' dx
    and dx * sum(xq), contiguous."""
    sc = [b.load(b.bitcast(b.gep(slot, [_c(B_BYTES + 64 * i)]), VF16.as_pointer()), align=64) for i in range(n_sc)]
    ca, da = b.ptrtoint(cbuf, I64), b.ptrtoint(dxb, I64)
    out = []
    for g, acc in enumerate(accs):
        # operands: $0 the sum (out), $1 the sum (in, tied), $2 C, $3 dx, $4 scale, $5 sx, $6 min scale
        text = (f"vpslld $$8, {64 * g}($2), %zmm30\n"
                f"vpaddd {C_BYTES + 64 * g}($2), %zmm30, %zmm30\n"
                "vcvtdq2ps %zmm30, %zmm30\n"
                f"vmulps {4 * g}($3){{1to16}}, $4, %zmm31\n"
                "vfmadd231ps %zmm31, %zmm30, $0")
        args = [acc, ca, da, sc[0]]
        cons = "=v,0,r,r,v"
        if n_sc == 2:  # -+ min * sum(x): fma(m, -sx, acc) is acc - m * sx rounded once, as vfnmadd gives it
            op = "vfnmadd231ps" if kind in MIN_SUB else "vfmadd231ps"
            text += f"\n{op} {4 * g}($5){{1to16}}, $6, $0"
            args += [b.ptrtoint(sxb, I64), sc[1]]
            cons += ",r,v"
        fn = ir.FunctionType(VF16, [a.type for a in args])
        out.append(b.call(ir.InlineAsm(fn, text, cons + ",~{zmm30},~{zmm31},~{memory}"), args))
    return out


def _amx_codegen(kind: int) -> Callable:  # type: ignore[type-arg]
    def codegen(context, b, signature, args):  # type: ignore[no-untyped-def]
        wa, xv, dv, sv, lane_v, groups, nsb, oa, os_, valid_v, scrv = args
        scr = b.ptrtoint(context.make_array(signature.args[10])(context, b, value=scrv).data, I64)
        xarr = context.make_array(signature.args[1])(context, b, value=xv)
        darr = context.make_array(signature.args[2])(context, b, value=dv)
        sarr = context.make_array(signature.args[3])(context, b, value=sv)
        nblk = cgutils.unpack_tuple(b, xarr.shape, 4)[1]
        base = b.and_(b.add(scr, _c(63)), _c(~63))  # 64-byte aligned
        cbuf0 = b.inttoptr(base, P8)  # two pairs of result tiles (C_hi, C_lo), block parity alternating
        slots0 = b.gep(cbuf0, [_c(4 * C_BYTES)])  # per block: B rows, scale vectors
        n_sc = 2 if kind in MIN_SUB or kind in MIN_ADD else 1
        mask = ir.Constant(ir.VectorType(I32, 2 * TILE), [j for k in range(TILE) for j in (k, TILE + k)])

        # 1. the tile's blocks in B layout, once for every lane group
        tile_bytes = b.mul(nsb, _c(SB_BYTES[kind]))
        prefetch = cgutils.get_or_insert_function(b.module, ir.FunctionType(ir.VoidType(), [P8, I32, I32, I32]),
                                                  "llvm.prefetch.p0i8")

        def unpack(p, blk, hdr):  # type: ignore[no-untyped-def]
            slot = b.gep(slots0, [b.mul(blk, _c(SLOT))])
            pairs = [b.bitcast(v, VH16W) for v in _pairs(kind, b, p)]
            for k in range(8):  # B row k: values 4k..4k+3 of each weight row (pairs 2k and 2k+1 interleaved)
                row = b.shuffle_vector(pairs[2 * k], pairs[2 * k + 1], mask)
                b.store(row, b.bitcast(b.gep(slot, [_c(64 * k)]), VB64W.as_pointer()), align=64)
            for i, v in enumerate(_scales(kind, b, p, hdr)[:n_sc]):
                b.store(v, b.bitcast(b.gep(slot, [_c(B_BYTES + 64 * i)]), VF16.as_pointer()), align=64)

        _sb_loop(kind, b, b.inttoptr(wa, P8), nsb, unpack)
        slots = [cgutils.alloca_once_value(b, ir.Constant(VF16, [0.0] * TILE)) for _ in range(LANES)]
        stride64, b_base = _c(64), b.ptrtoint(slots0, I64)

        # 2. every lane group against the unpacked tile, block by block
        with cgutils.for_range(b, groups) as grp:
            gi = b.add(b.sdiv(lane_v, _c(LANES)), grp.index)  # the group's index in xpk, dx, sxd
            x0 = b.ptrtoint(b.gep(xarr.data, [b.mul(gi, b.mul(nblk, _c(LANES * 64)))]), I64)
            dx0 = b.gep(darr.data, [b.mul(gi, b.mul(nblk, _c(LANES)))])
            sx0 = b.gep(sarr.data, [b.mul(gi, b.mul(nblk, _c(LANES)))])
            for s_ in slots:
                b.store(ir.Constant(VF16, [0.0] * TILE), s_)
            # software-pipelined: block k's products are issued before block k-1's results are read back,
            # so the tile stores have landed when the vector loads come (result tiles alternate by parity)
            with cgutils.for_range(b, b.add(nblk, _c(1))) as blk_loop:
                blk = blk_loop.index
                with b.if_then(b.icmp_signed("==", grp.index, _c(0))):
                    # the next tile (unpacked after this one), a block's share of its bytes per block of the
                    # first group: its loads are then done when the unpacking comes (streamed from memory, a
                    # head ran at 0.7x the rate of one in cache without it)
                    nxt = b.gep(b.inttoptr(wa, P8), [b.add(tile_bytes, b.mul(blk, _c(BLOCK_SHARE[kind])))])
                    for line in range(0, BLOCK_SHARE[kind], 64):
                        b.call(prefetch, [b.gep(nxt, [_c(line)]), _c(0, I32), _c(2, I32), _c(1, I32)])
                with b.if_then(b.icmp_signed("<", blk, nblk)):
                    cbuf = b.gep(cbuf0, [b.mul(b.and_(blk, _c(1)), _c(2 * C_BYTES))])
                    xa = b.add(x0, b.mul(blk, _c(LANES * 64)))
                    _asm(b, "tileloadd ($0,$3,1), %tmm4\n"
                            "tileloadd ($1,$3,1), %tmm2\n"
                            "tileloadd 32($1,$3,1), %tmm3\n"
                            "tilezero %tmm0\n"
                            "tilezero %tmm1\n"
                            "tdpbssd %tmm4, %tmm2, %tmm0\n"
                            "tdpbusd %tmm4, %tmm3, %tmm1\n"
                            "tilestored %tmm0, ($2,$3,1)\n"
                            "tilestored %tmm1, 1024($2,$3,1)",
                         [b.add(b_base, b.mul(blk, _c(SLOT))), xa, b.ptrtoint(cbuf, I64), stride64])
                with b.if_then(b.icmp_signed(">", blk, _c(0))):
                    prev = b.sub(blk, _c(1))
                    accs = _epilogue(b, kind, n_sc, b.gep(slots0, [b.mul(prev, _c(SLOT))]),
                                     b.gep(cbuf0, [b.mul(b.and_(prev, _c(1)), _c(2 * C_BYTES))]),
                                     b.gep(dx0, [b.mul(prev, _c(LANES))]), b.gep(sx0, [b.mul(prev, _c(LANES))]),
                                     [b.load(s_) for s_ in slots])
                    for s_, a in zip(slots, accs, strict=True):
                        b.store(a, s_)
            _store_lanes(b, [b.load(s_) for s_ in slots], b.add(oa, b.mul(os_, b.mul(grp.index, _c(LANES)))),
                         os_, valid_v)
        return context.get_dummy_value()

    return codegen


@intrinsic
def tile_config(typingctx):  # type: ignore[no-untyped-def]
    """Load the tile configuration on this thread (tdot16x's tiles): once per run of calls, not per call
    (a configure and release around each tile cost more than its products)."""

    def codegen(context, b, signature, args):  # type: ignore[no-untyped-def]
        _asm(b, "ldtilecfg ($0)", [_config(b)])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def tile_release(typingctx):  # type: ignore[no-untyped-def]
    """Give the tile state back (the thread's next context switch saves less)."""

    def codegen(context, b, signature, args):  # type: ignore[no-untyped-def]
        _asm(b, "tilerelease", [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic(prefer_literal=True)
def tdot16x(typingctx, kinds, kind, w_addr, xpk, dx, sxd, lane, groups, n_super, out_addr, out_stride, valid,  # type: ignore[no-untyped-def]
            scratch):
    """One tile of 16 rows (raw address) against `groups` groups of 16 lanes from `lane` (a multiple of 16) on
    AMX: xpk int8 [B / 16, n / 32, 16, 64] (`split_row` of the int16 activations), the block scales dx and
    dx * sum(xq) side by side (float32 [B / 16, n / 32, 16]); row i of lane g goes to out_addr + g * out_stride
    + 4 i for i < valid. `scratch`: a uint8 array of scratch_bytes(n) (the tile in B layout, the result tiles;
    an array, so numba keeps it alive). The thread must hold the tile configuration (`tile_config`). `kinds` a
    literal mask: only the kinds of AMX_KINDS in it get a body (a kind outside does nothing)."""
    if not isinstance(kinds, types.IntegerLiteral):
        raise TypeError("tdot16x: the tile kinds must be a literal bit mask")
    u = types.uint64
    sig = types.void(kinds, types.int64, u, xpk, dx, sxd, types.int64, types.int64, types.int64, u, u, types.int64,
                     scratch)
    amx_mask = kinds.literal_value & AMX_KINDS
    if not amx_mask:
        return sig, lambda context, b, signature, args: context.get_dummy_value()
    inner = _by_kind(_amx_codegen, "tdot16x")

    def codegen(context, b, signature, args):  # type: ignore[no-untyped-def]
        return inner(context, b, types.void(types.IntegerLiteral(amx_mask), *signature.args[1:]), args)

    return sig, codegen
