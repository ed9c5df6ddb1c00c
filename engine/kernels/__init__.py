"""numba / LLVM-IR compute kernels: block and tile dots, GEMM drivers, attention, row-wise ops, threads.

Import the module you need (blockdot, tiledot, tilegemm, attention, ops, parallel); nothing is re-exported.
"""
