"""Task claiming inside one parallel region: atomic counters, so threads share phases without a launch each.

A phase is `n` tasks. Each thread claims task ids from the phase's counter (`claim`), runs them, counts
each one done (`finish`), and waits until all `n` are done before the next phase (`wait_done`). A thread
that never arrives (a team smaller than asked for) cannot stall the others: the first thread claims
every task itself. Counters live in an int64 array, one 64-byte line per phase (claim at 8p, done at
8p + 1), zeroed by the caller before the region starts.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

LINE = 8  # int64 counters per phase: one cache line, so two phases' counters never share a line
SPINS = 1 << 14  # pauses (~20-40 ns each) before a waiting thread starts yielding its core
SYS_SCHED_YIELD = 24  # x86-64 Linux


@intrinsic
def _fetch_add(typingctx, arr, idx, val):  # type: ignore[no-untyped-def]
    """Atomically arr[idx] += val (sequentially consistent); returns the old value."""
    sig = types.int64(arr, types.intp, types.int64)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        a = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.atomic_rmw("add", builder.gep(a.data, [args[1]]), args[2], "seq_cst")

    return sig, codegen


@intrinsic
def _load_acquire(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """arr[idx] read with acquire order: what the thread that counted it wrote before is visible after."""
    sig = types.int64(arr, types.intp)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        a = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.load_atomic(builder.gep(a.data, [args[1]]), "acquire", 8)

    return sig, codegen


@intrinsic
def _pause(typingctx):  # type: ignore[no-untyped-def]
    """x86 `pause` in a spin loop (yields the core's pipeline, cheaper exit from the loop)."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "pause", "", side_effect=True), [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def _sched_yield(typingctx):  # type: ignore[no-untyped-def]
    """sched_yield(2) as a raw syscall (a ctypes call would keep numba from caching the kernel)."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        i64 = ir.IntType(64)
        asm = ir.InlineAsm(ir.FunctionType(i64, [i64]), "syscall", "={rax},{rax},~{rcx},~{r11},~{memory}",
                           side_effect=True)
        builder.call(asm, [ir.Constant(i64, SYS_SCHED_YIELD)])
        return context.get_dummy_value()

    return types.void(), codegen


@njit(inline="always")
def claim(ctr, phase):  # type: ignore[no-untyped-def]
    """The next unclaimed task id of `phase` (>= its task count once all are taken)."""
    return _fetch_add(ctr, phase * LINE, 1)


@njit(inline="always")
def finish(ctr, phase):  # type: ignore[no-untyped-def]
    _fetch_add(ctr, phase * LINE + 1, 1)


@njit(inline="always")
def wait_done(ctr, phase, n):  # type: ignore[no-untyped-def]
    """Spin (a phase is microseconds), then yield the core: when more threads than cores are runnable (a
    prefill worker beside the decode step), the thread that holds the last task must get to run."""
    spins = 0
    while _load_acquire(ctr, phase * LINE + 1) < n:
        if spins < SPINS:
            _pause()
            spins += 1
        else:
            _sched_yield()


@intrinsic
def cycles(typingctx):  # type: ignore[no-untyped-def]
    """The CPU's time-stamp counter (llvm.readcyclecounter): per-phase timing inside a region."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        fn = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=ir.FunctionType(ir.IntType(64), []))
        return builder.call(fn, [])

    return types.int64(), codegen
