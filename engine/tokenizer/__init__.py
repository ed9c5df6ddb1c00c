"""The tokenizer embedded in a GGUF: vocabulary, the `tokenizers` build and its cache, streaming
detokenizer, chat templates. Exports: load_tokenizer, GGUFTokenizer, ByteTokenizer, NoTokenizer."""

from engine.tokenizer.tokenizer import ByteTokenizer, GGUFTokenizer, load_tokenizer
from engine.tokenizer.vocab import NoTokenizer

__all__ = ["ByteTokenizer", "GGUFTokenizer", "NoTokenizer", "load_tokenizer"]
