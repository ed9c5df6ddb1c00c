"""One decode row through a band of layers in ONE parallel region: no kernel launch per product or norm.

Why: a single-lane decode step of the generic forward makes ~9 calls a layer (products, the fused glue,
attention), each paying Python, numba dispatch and a thread-team start (~4-10 us; measured: residual_norm
5.7 us a call for 1.3 us of work). Here the team starts once per step and the threads pass the phases
of every layer, then the output norm and the LM head, through atomic counters (engine/kernels/tasks.py):
a phase's weight products are claimed in guided chunks of tiles (`_products`), attention in the chunks of
batched_attention, the gated activation (and the down product's input quantization) in two halves, the
other row glue as one task.

Every phase calls the same compiled code the generic path runs: tdot1 on each tile after
quantize_rows_i16 (gemm_tiles' single-lane path), the serial twins of _rmsnorm, _qkv_prep,
_residual_norm and _gated, attention's attend_chunk and merge_chunks. So a row gets the same bits
through here as through the generic forward, alone or in a batch (tests/engine/kernels/test_lane_kernel.py).

Layout of `buf` (float32, offsets in `offs`): X (the residual stream), H (the normed row), Q|K|V (the
products' outputs, end to end as fused weights write them), QO|KO|VO (heads after qkv_prep), ATT, O,
G|U, ACT, D.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from engine.kernels.attention import attend_chunk, key_tiles, merge_chunks, score_columns
from engine.kernels.blockdot import U
from engine.kernels.kvtype import TILE_KEYS, kv_put
from engine.kernels.ops import _gated, _qkv_prep, _residual_norm, _rmsnorm
from engine.kernels.parallel import serial_twin
from engine.kernels.tasks import LINE, _fetch_add, _load_acquire, claim, cycles, finish, wait_done
from engine.kernels.tiledot import tdot1
from engine.kernels.tilegemm import quantize_rows_i16
from engine.quant.tiles import ALL_KINDS, FLOAT_KINDS, SB_VALUES, TILE

PHASES_PER_LAYER = 10  # qkv, prep, attend, merge, o, residual, gate|up, act, down, residual
HEAD_PHASES = 2  # output norm, LM head

# buf offsets (indices into `offs`)
X, H, Q, QO, KO, VO, ATT, O, G, ACT, D = range(11)
# prods columns
P_KIND, P_W, P_NTILES, P_WSTRIDE, P_N, P_ROWS, P_IN, P_OUT, P_TPT = range(9)
# layer_prods columns: product index ranges of the layer's four phases
L_QKV0, L_QKV1, L_O, L_GU0, L_GU1, L_DOWN = range(6)

_rmsnorm_s = serial_twin(_rmsnorm)
_qkv_prep_s = serial_twin(_qkv_prep)
_residual_norm_s = serial_twin(_residual_norm)
_gated_s = serial_twin(_gated)


@njit(nogil=True, cache=True)
def _quantize(x, xq, dx, sxd):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    quantize_rows_i16(x, xq, dx, sxd)  # compiled as gemm_tiles compiles it (no fast-math)


@njit(nogil=True, cache=True)
def _tiles(kind, wa, ws, rows, t0, t1, xq, dx, sxd, xf, nsb, oa):  # type: ignore[no-untyped-def]  # pragma: no cover
    for t in range(t0, t1):
        tdot1(ALL_KINDS, kind, wa + U(t) * ws, xq, dx, sxd, xf, 0, nsb, oa + U(t * TILE * 4), U(0), min(TILE, rows - t * TILE))


@njit(inline="always")
def _next(stamps, ph, timed):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """After phase ph: its end on the cycle counter (the first thread, when timing); the next phase."""
    if timed:
        stamps[ph + 1] = cycles()
    return ph + 1


@njit(nogil=True, cache=True)
def _products(prods, a, b, buf, ctr, phase, xq_buf, dxb, sxb, nthreads, out, quantize, th):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Products a..b-1 (one input) over the team; returns when all are done. The phase's tiles (every
    product's, end to end) are claimed in guided chunks: a quarter of what is left at first, then less,
    never under the product's P_TPT tiles, so the threads finish together after few claims. Outputs go
    to `out` at each product's P_OUT (buf itself for the layers, the logits for the head). quantize=False:
    xq_buf, dxb, sxb already hold the input quantized (the gated phase does it, split over the team).
    Thread th (< 6) counts its claims in the phase's spare counter slot 2 + th (tests: both threads worked)."""
    n = prods[a, P_N]
    i0 = prods[a, P_IN]
    xf = buf[i0:i0 + n].reshape((1, n))
    floats = prods[a, P_KIND] >= FLOAT_KINDS
    skip = ((64 - xq_buf.ctypes.data % 64) % 64) // 2  # 64-byte aligned int16 rows, as gemm_tiles keeps them
    m = 0 if floats else n
    xq = xq_buf[skip:skip + m].reshape((1, m))
    dx = dxb[:m // 32].reshape((1, m // 32))
    sxd = sxb[:m // 32].reshape((1, m // 32))
    if m and quantize:
        _quantize(xf, xq, dx, sxd)
    total = 0
    for p in range(a, b):
        total += prods[p, P_NTILES]
    ba = U(out.ctypes.data)
    while True:
        left = total - _load_acquire(ctr, phase * LINE)
        k = max(prods[a, P_TPT], left // (2 * nthreads))
        g = _fetch_add(ctr, phase * LINE, k)
        if g >= total:
            break
        end = min(g + k, total)
        g0 = g
        p, base = a, 0
        while g < end:
            while g >= base + prods[p, P_NTILES]:
                base += prods[p, P_NTILES]
                p += 1
            kind = prods[p, P_KIND]
            t1 = min(end - base, prods[p, P_NTILES])
            _tiles(kind, U(prods[p, P_W]), U(prods[p, P_WSTRIDE]), prods[p, P_ROWS], g - base, t1, xq, dx, sxd, xf,
                   n // SB_VALUES[kind], ba + U(prods[p, P_OUT] * 4))
            g = base + t1
        _fetch_add(ctr, phase * LINE + 1, end - g0)
        if th < LINE - 2:
            ctr[phase * LINE + 2 + th] += 1
    wait_done(ctr, phase, total)


@njit(parallel=True, nogil=True, cache=True)
def lane_layers(nthreads, lo, hi, kv0, prods, layer_prods, buf, offs, dims,
                attn_norm, ffn_norm, post_attn, post_ffn, bq, bk, bv, q_norm, k_norm,
                cos, sin, rope_on, neox, windows, eps, scale, res_scale, softcap, gelu,
                k_pool, v_pool, table, pos, dest_block, dest_off, chunk, part_m, part_l, part_o, ctr, none1, stamps,
                head, out_norm, logits):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Layers lo..hi-1 on the row buf[X] (the first layer's input norm included); K/V of layer li go to
    layer li - kv0 of the pools at (dest_block, dest_off); the row attends positions through `table`.
    none1: an empty float32 vector (no next norm after the band's last layer). stamps: empty, or int64
    [phases + 1] that the first thread fills with the cycle counter at the start and after each phase
    (bench/breakdown.py). head: the product index of the LM head (-1: none); then the output norm
    out_norm and the head run as two more phases, into logits [vocab]."""
    hidden, n_heads, kvh, dim, ffn = dims[0], dims[1], dims[2], dims[3], dims[4]
    q_dim, kv_dim, group = n_heads * dim, kvh * dim, n_heads // kvh
    xo, ho = offs[X], offs[H]
    x2 = buf[xo:xo + hidden].reshape((1, hidden))
    h2 = buf[ho:ho + hidden].reshape((1, hidden))
    q2 = buf[offs[Q]:offs[Q] + q_dim].reshape((1, q_dim))
    k2 = buf[offs[Q] + q_dim:offs[Q] + q_dim + kv_dim].reshape((1, kv_dim))
    v2 = buf[offs[Q] + q_dim + kv_dim:offs[Q] + q_dim + 2 * kv_dim].reshape((1, kv_dim))
    qo = buf[offs[QO]:offs[QO] + q_dim].reshape((1, n_heads, dim))
    ko = buf[offs[KO]:offs[KO] + kv_dim].reshape((1, kvh, dim))
    vo = buf[offs[VO]:offs[VO] + kv_dim].reshape((1, kvh, dim))
    att = buf[offs[ATT]:offs[ATT] + q_dim].reshape((n_heads, dim))
    o2 = buf[offs[O]:offs[O] + hidden].reshape((1, hidden))
    d2 = buf[offs[D]:offs[D] + hidden].reshape((1, hidden))
    qa = U(buf.ctypes.data) + U(offs[QO] * 4)
    bt = k_pool.shape[2]
    ks0, ks1, ks2 = U(k_pool.strides[1]), U(k_pool.strides[2]), U(k_pool.strides[3])
    vs0, vs1, vs2 = U(v_pool.strides[1]), U(v_pool.strides[2]), U(v_pool.strides[3])
    maxn = max(hidden, q_dim, ffn)
    sq_buf = np.empty(ffn + 32, dtype=np.int16)  # the down product's input, quantized once by the team
    sdx = np.empty(ffn // 32, dtype=np.float32)
    ssx = np.empty(ffn // 32, dtype=np.float32)
    sq_skip = ((64 - sq_buf.ctypes.data % 64) % 64) // 2
    mid = (ffn // 64) * 32
    for th in prange(nthreads):
        xq_buf = np.empty(maxn + 32, dtype=np.int16)  # each thread quantizes a product's input itself
        dxb = np.empty(maxn // 32, dtype=np.float32)
        sxb = np.empty(maxn // 32, dtype=np.float32)
        # attend_chunk's scratch: the scores, the K and V rows' addresses, the key tiles
        s = np.empty((group, score_columns(chunk)), dtype=np.float32)
        kvrows = np.empty((2, chunk), dtype=np.uint64)
        kt = np.empty((key_tiles(chunk), dim, TILE_KEYS), dtype=np.float32)
        ph = 0
        timed = th == 0 and stamps.shape[0] != 0
        if timed:
            stamps[0] = cycles()
        if claim(ctr, ph) == 0:  # the first layer's input norm
            _rmsnorm_s(x2, attn_norm[lo], eps, h2)
            finish(ctr, ph)
        wait_done(ctr, ph, 1)
        ph = _next(stamps, ph, timed)
        for li in range(lo, hi):
            lp = layer_prods[li]
            _products(prods, lp[L_QKV0], lp[L_QKV1], buf, ctr, ph, xq_buf, dxb, sxb, nthreads, buf, True, th)
            ph = _next(stamps, ph, timed)
            if claim(ctr, ph) == 0:  # biases, q/k norms, RoPE; then the row's own K/V into the pool
                _qkv_prep_s(q2, k2, v2, bq[li], bk[li], bv[li], q_norm[li], k_norm[li], cos[li:li + 1],
                            sin[li:li + 1], rope_on[li], neox, eps, qo, ko, vo)
                kv_put(k_pool, U(k_pool[li - kv0, dest_block, dest_off].ctypes.data), U(ko.ctypes.data), kv_dim)
                kv_put(v_pool, U(v_pool[li - kv0, dest_block, dest_off].ctypes.data), U(vo.ctypes.data), kv_dim)
                finish(ctr, ph)
            wait_done(ctr, ph, 1)
            ph = _next(stamps, ph, timed)
            first = 0
            w = windows[li]
            if w > 0 and pos - w + 1 > 0:
                first = pos - w + 1
            nch = (pos - first + chunk) // chunk
            ka = U(k_pool.ctypes.data) + U(li - kv0) * U(k_pool.strides[0])
            va = U(v_pool.ctypes.data) + U(li - kv0) * U(v_pool.strides[0])
            while True:
                task = claim(ctr, ph)
                if task >= nch * kvh:
                    break
                ci, kh = task // kvh, task % kvh
                c0 = first + ci * chunk
                attend_chunk(k_pool, v_pool, qa, ka, va, ks0, ks1, ks2, vs0, vs1, vs2, table, bt, kh, c0,
                             min(pos + 1, c0 + chunk) - c0, scale, softcap, s, kvrows, kt, part_m[ci, kh], part_l[ci, kh],
                             part_o[ci, kh])
                finish(ctr, ph)
            wait_done(ctr, ph, nch * kvh)
            ph = _next(stamps, ph, timed)
            while True:
                kh = claim(ctr, ph)
                if kh >= kvh:
                    break
                merge_chunks(part_m[:nch, kh], part_l[:nch, kh], part_o[:nch, kh], att[kh * group:(kh + 1) * group])
                finish(ctr, ph)
            wait_done(ctr, ph, kvh)
            ph = _next(stamps, ph, timed)
            _products(prods, lp[L_O], lp[L_O] + 1, buf, ctr, ph, xq_buf, dxb, sxb, nthreads, buf, True, th)
            ph = _next(stamps, ph, timed)
            if claim(ctr, ph) == 0:
                _residual_norm_s(x2, o2, post_attn[li], res_scale, ffn_norm[li], eps, x2, h2)
                finish(ctr, ph)
            wait_done(ctr, ph, 1)
            ph = _next(stamps, ph, timed)
            _products(prods, lp[L_GU0], lp[L_GU1], buf, ctr, ph, xq_buf, dxb, sxb, nthreads, buf, True, th)
            ph = _next(stamps, ph, timed)
            # act(gate) * up in two halves (at a multiple of 32), each half then quantized for the down
            # product into the shared buffers: elementwise and per 32-value block, so the same bits
            floats = prods[lp[L_DOWN], P_KIND] >= FLOAT_KINDS
            while True:
                part = claim(ctr, ph)
                if part >= 2:
                    break
                c0, c1 = (0, mid) if part == 0 else (mid, ffn)
                if c1 > c0:
                    a_half = buf[offs[ACT] + c0:offs[ACT] + c1].reshape((1, c1 - c0))
                    _gated_s(buf[offs[G] + c0:offs[G] + c1].reshape((1, c1 - c0)), 0,
                             buf[offs[G] + ffn + c0:offs[G] + ffn + c1].reshape((1, c1 - c0)), 0, gelu, a_half)
                    if not floats:
                        _quantize(a_half, sq_buf[sq_skip + c0:sq_skip + c1].reshape((1, c1 - c0)),
                                  sdx[c0 // 32:c1 // 32].reshape((1, (c1 - c0) // 32)),
                                  ssx[c0 // 32:c1 // 32].reshape((1, (c1 - c0) // 32)))
                finish(ctr, ph)
            wait_done(ctr, ph, 2)
            ph = _next(stamps, ph, timed)
            _products(prods, lp[L_DOWN], lp[L_DOWN] + 1, buf, ctr, ph, sq_buf, sdx, ssx, nthreads, buf, False, th)
            ph = _next(stamps, ph, timed)
            if claim(ctr, ph) == 0:  # the next layer's input norm fused (none after the band's last)
                _residual_norm_s(x2, d2, post_ffn[li], res_scale, attn_norm[li + 1] if li + 1 < hi else none1,
                                 eps, x2, h2)
                finish(ctr, ph)
            wait_done(ctr, ph, 1)
            ph = _next(stamps, ph, timed)
        if head >= 0:
            if claim(ctr, ph) == 0:  # the output norm, then the head (as Model.finish does them)
                _rmsnorm_s(x2, out_norm, eps, h2)
                finish(ctr, ph)
            wait_done(ctr, ph, 1)
            ph = _next(stamps, ph, timed)
            _products(prods, head, head + 1, buf, ctr, ph, xq_buf, dxb, sxb, nthreads, logits, True, th)
            ph = _next(stamps, ph, timed)
