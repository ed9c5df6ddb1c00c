"""engine: the in-kernel model runtime (usable on its own; never imports fak/ or commands/).

Public API: load_model, Session, BatchSession, step_batch, ModelConfig, synthetic_model, sampling.
"""

from engine.config import ModelConfig
from engine.model import Model
from engine.sampling import Sampler, SamplingParams, greedy
from engine.session import BatchSession, Session, step_batch
from engine.synthetic import synthetic_model
from engine.tokenizer import ByteTokenizer, load_tokenizer  # noqa: F401  (tokenizer API)


def load_model(path_or_alias: str | None = None, resident: bool = False, progress: bool | None = None) -> Model:
    """A GGUF path or alias (None -> $FAK_MODEL or gemma3-270m; "synthetic" -> the synthetic checkpoint)."""
    if path_or_alias == "synthetic":
        return synthetic_model()
    from engine.gguf_load import load_gguf_model

    return load_gguf_model(path_or_alias, resident=resident, progress=progress)


__all__ = [
    "BatchSession",
    "Model",
    "ModelConfig",
    "Sampler",
    "SamplingParams",
    "Session",
    "greedy",
    "load_model",
    "step_batch",
    "synthetic_model",
]
