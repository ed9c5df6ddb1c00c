"""engine: the in-kernel model runtime, usable on its own (never imports fak/ or commands/).

Packages, lower first: gguf, quant, kernels, model, tokenizer, grammar, sched (dist/ is next). This
re-exports the public API: load_model, Session, step_batch, ModelConfig, sampling, load_tokenizer,
NativeScheduler, Request, GrammarSpec.
"""

from engine.gguf.config import ModelConfig
from engine.grammar.spec import GrammarSpec
from engine.model.forward import Model
from engine.model.loader import load_model
from engine.model.sampling import Sampler, SamplingParams, greedy
from engine.model.session import BatchSession, Session, step_batch
from engine.model.synthetic import synthetic_model
from engine.sched.lane import Request
from engine.sched.scheduler import NativeScheduler
from engine.tokenizer.tokenizer import ByteTokenizer, load_tokenizer

__all__ = [
    "BatchSession",
    "ByteTokenizer",
    "GrammarSpec",
    "Model",
    "ModelConfig",
    "NativeScheduler",
    "Request",
    "Sampler",
    "SamplingParams",
    "Session",
    "greedy",
    "load_model",
    "load_tokenizer",
    "step_batch",
    "synthetic_model",
]
