"""How many integer dot instructions this core issues a cycle: the bound under a batch's rows.

    python bench/mul_port.py [--iters 50000000]

A verification row (speculation) or a batch lane costs compute, not weight reads: 16 rows of Qwen 2.5 0.5B
cost 7.8 one-row steps on a Zen 2 host. What a row can cost at best is set by the instruction the tile
kernels multiply with (engine/kernels/tiledot.py): `vpmaddwd` (int16 pairs, 16 multiply-adds a 256-bit
instruction) on AVX2, `vpdpwssd` (32, with AVX-512 VNNI). int8 activations would use `vpmaddubsw` (32 a
256-bit instruction, but its int16 sums need a `vpmaddwd` by ones to widen). Each is timed here in ten
independent chains (inline asm, so nothing is reordered or folded) against a dependent chain of scalar adds
(one a cycle): cycles per instruction, and the multiply-adds a core can do per ns at this clock.
"""

from __future__ import annotations

import argparse
import ctypes
import time

from llvmlite import binding as llvm
from llvmlite import ir

CHAINS = 10


def _loop(op: ir.InlineAsm, init: ir.Constant, chains: int, extra: list[ir.Value]) -> ir.Module:
    """run(n): n times, `op` on each of `chains` values carried round the loop (op(value, *extra))."""
    mod = ir.Module(name="mul_port")
    i64 = ir.IntType(64)
    fn = ir.Function(mod, ir.FunctionType(i64, [i64]), name="run")
    entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(i64)
    carried = [b.phi(init.type) for _ in range(chains)]
    nxt = [b.call(op, [v, *extra]) for v in carried]
    i2 = b.add(i, ir.Constant(i64, 1))
    b.cbranch(b.icmp_signed("<", i2, fn.args[0]), loop, done)
    i.add_incoming(ir.Constant(i64, 0), entry)
    i.add_incoming(i2, loop)
    for v, n in zip(carried, nxt, strict=True):
        v.add_incoming(init, entry)
        v.add_incoming(n, loop)
    b.position_at_end(done)
    b.ret(i2)
    return mod


def _vector_chains(asm_text: str, width: int) -> ir.Module:
    """The instruction on CHAINS independent vector registers, its second operand all ones."""
    vec = ir.VectorType(ir.IntType(32), width // 32)
    one = ir.Constant(vec, [1] * (width // 32))
    op = ir.InlineAsm(ir.FunctionType(vec, [vec, vec]), asm_text, "=v,0,v", side_effect=True)
    return _loop(op, one, CHAINS, [one])


def _scalar_chain() -> ir.Module:
    """8 dependent scalar adds an iteration: one a cycle, the clock."""
    i64 = ir.IntType(64)
    add8 = ir.InlineAsm(ir.FunctionType(i64, [i64]), "add $$1, $0\n" * 8, "=r,0", side_effect=True)
    return _loop(add8, ir.Constant(i64, 0), 1, [])


def _time(mod: ir.Module, iters: int) -> float:
    """Seconds per loop iteration, the best of 3."""
    target = llvm.Target.from_default_triple().create_target_machine(cpu=llvm.get_host_cpu_name(),
                                                                     features=llvm.get_host_cpu_features().flatten())
    parsed = llvm.parse_assembly(str(mod))
    engine = llvm.create_mcjit_compiler(parsed, target)
    engine.finalize_object()
    run = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(engine.get_function_address("run"))
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        run(iters)
        best = min(best, time.perf_counter() - t)
    return best / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=50_000_000)
    a = ap.parse_args()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()
    features = llvm.get_host_cpu_features()
    cycle = _time(_scalar_chain(), a.iters) / 8
    print(f"bench/mul_port.py: {llvm.get_host_cpu_name()}, clock {1e-9 / cycle:.2f} GHz (a chain of dependent adds)")
    cases = [("vpmaddwd", "vpmaddwd $2, $1, $0", 256, 16), ("vpmaddubsw", "vpmaddubsw $2, $1, $0", 256, 32),
             ("vpaddd", "vpaddd $2, $1, $0", 256, 0)]
    if features.get("avx512vnni", False):
        cases.append(("vpdpwssd zmm", "vpdpwssd $2, $2, $0", 512, 32))
    cycles: dict[str, float] = {}
    for name, text, width, macs in cases:
        per = cycles[name] = _time(_vector_chains(text, width), a.iters) / CHAINS
        rate = f", {macs / per * 1e-9:6.1f} multiply-adds/ns a core" if macs else ""
        print(f"  {name:13s} {per / cycle:5.2f} cycles an instruction{rate}")
    # exact int32 sums, as the kernels keep them: int16 is one vpmaddwd; int8 is vpmaddubsw, then vpmaddwd by
    # ones to widen its int16 pair sums (accumulating in int16 saturates)
    i16 = 16 / cycles["vpmaddwd"] * 1e-9
    i8 = 32 / (cycles["vpmaddubsw"] + cycles["vpmaddwd"]) * 1e-9
    print(f"  exact int32 sums on AVX2: int16 activations {i16:.1f}, int8 activations {i8:.1f} multiply-adds/ns a "
          f"core (int8 / int16 = {i8 / i16:.2f})")


if __name__ == "__main__":
    main()
