"""GGML block formats: numpy dequantizers (the reference; every type gguf-py reads), numba row dequantizers,
quantizers, and the 16-row tile layouts resident weights are repacked into. Exports: dequantize, SUPPORTED, quantize_*."""

from engine.quant.dequant import SUPPORTED, dequantize
from engine.quant.quantize import quantize_as, quantize_q4_k, quantize_q5_k, quantize_q6_k, quantize_q8_0

__all__ = ["SUPPORTED", "dequantize", "quantize_as", "quantize_q4_k", "quantize_q5_k", "quantize_q6_k", "quantize_q8_0"]
