"""The GGUF file format: header and tensor index (memory-mapped), ModelConfig from metadata, model aliases
and the models shipped as PyPI chunk packages (packaged.py: located, assembled once, verified).

Exports: read_gguf, read_metadata, GGUFFile, TensorInfo, ModelConfig, from_gguf_metadata, resolve_model.
"""

from engine.gguf.aliases import default_model, resolve_model
from engine.gguf.config import ModelConfig, from_gguf_metadata
from engine.gguf.reader import GGUFFile, TensorInfo, read_gguf, read_metadata

__all__ = ["GGUFFile", "ModelConfig", "TensorInfo", "default_model", "from_gguf_metadata", "read_gguf",
           "read_metadata", "resolve_model"]
