"""The one boot (fak/runtime/boot.py) and what `fak run` does with it: chat templates only where the GGUF has
one (--chat / --raw override), the boot line and progress bar on a terminal only, bad --gguf in one line."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support import paths
from support.ggufgen import tiny_llama_gguf

REPO = paths.REPO
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]
MERGED = "ĠĠ"  # the one merge's result (two spaces), after the specials
BOS, EOS, IM_START, IM_END = 256, 257, 258, 259


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte 0..255, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra, out = 0, []
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def tiny_chat_gguf(path: Path, template: str | None, add_bos: bool | None = None) -> Path:
    """A 1-layer llama with a byte-level vocabulary of 261 (bytes, <s> </s> <|im_start|> <|im_end|>, "ĠĠ")."""
    tokens = _byte_alphabet() + SPECIALS + [MERGED]
    kv: dict[str, object] = {"llama.vocab_size": len(tokens), "tokenizer.ggml.model": "gpt2",
                             "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
                             "tokenizer.ggml.token_type": [1] * 256 + [3] * 4 + [1], "tokenizer.ggml.merges": ["Ġ Ġ"],
                             "tokenizer.ggml.bos_token_id": BOS, "tokenizer.ggml.eos_token_id": EOS}
    if template is not None:
        kv["tokenizer.chat_template"] = template
    if add_bos is not None:
        kv["tokenizer.ggml.add_bos_token"] = add_bos
    emb = np.random.default_rng(3).standard_normal((len(tokens), 32)).astype(np.float32)
    return tiny_llama_gguf(path, kv=kv, tensors={"token_embd.weight": emb})


def fak(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FAK_")} | (env or {})
    return subprocess.run([sys.executable, "-m", "commands.main", "run", *args], capture_output=True, text=True,
                          timeout=180, cwd=REPO, env=clean)


def prompt_ids(*args: str) -> list[int]:
    r = fak(*args, "--json", "--max-tokens", "1")
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout)["prompt_ids"])


@pytest.mark.slow
def test_template_from_the_gguf_by_default_and_raw_turns_it_off(tmp_path: Path) -> None:
    p = str(tiny_chat_gguf(tmp_path / "chat.gguf", TEMPLATE))
    nl = ord("\n")
    chat = [IM_START, *b"user", nl, *b"hi", IM_END, nl, IM_START, *b"assistant", nl]
    assert prompt_ids(p, "hi") == chat
    assert prompt_ids(p, "hi", "--raw") == [*b"hi"]  # the file does not ask for BOS
    sys_chat = [IM_START, *b"system", nl, *b"Be brief.", IM_END, nl] + chat
    assert prompt_ids(p, "hi", "--system", "Be brief.") == sys_chat
    r = fak(p, "hi", "--chat", "--raw")
    assert r.returncode == 2 and r.stderr.strip() == "fak: error: --chat and --raw contradict each other"


@pytest.mark.slow
def test_base_model_gets_raw_completion_and_chat_forces_the_fallback(tmp_path: Path) -> None:
    p = str(tiny_chat_gguf(tmp_path / "base.gguf", None))
    assert prompt_ids(p, "hi") == [*b"hi"]
    forced = prompt_ids(p, "hi", "--chat")  # no template in the file: the built-in ChatML layout
    assert forced[0] == IM_START and IM_END in forced and forced != [*b"hi"]


@pytest.mark.slow
def test_raw_completion_adds_bos_when_the_file_asks(tmp_path: Path) -> None:
    p = str(tiny_chat_gguf(tmp_path / "bos.gguf", TEMPLATE, add_bos=True))
    assert prompt_ids(p, "hi", "--raw") == [BOS, *b"hi"]  # BOS + text, as llama.cpp's completion tool does
    assert prompt_ids(p, "hi")[:2] == [BOS, IM_START]  # the template's prompt gets one BOS too


def _run_on_a_tty(args: list[str]) -> tuple[int, str, str]:
    """Run `fak run ARGS` with stderr on a pseudo-terminal (stdout a pipe); returns rc, stdout, stderr."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAK_")} | {"COLUMNS": "200", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "commands.main", "run", *args], stdout=subprocess.PIPE,
                            stderr=slave, cwd=REPO, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    out, _ = proc.communicate(timeout=180)
    os.close(master)
    err = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode("utf-8", "replace"))  # cursor moves
    return proc.returncode, out.decode(), "\n".join(re.split(r"[\r\n]+", err))


@pytest.mark.slow
def test_boot_line_and_progress_on_a_tty_absent_with_json(tmp_path: Path) -> None:
    p = str(tiny_chat_gguf(tmp_path / "tty.gguf", TEMPLATE))
    rc, out, err = _run_on_a_tty([p, "hi", "--max-tokens", "2"])
    assert rc == 0, err
    line = next(ln for ln in err.splitlines() if ln.startswith("fak: "))
    assert f"fak: {p} · llama · 1 layer · F32:11 · " in line and "resident" in line and "MiB" in line
    assert "loaded in" in line and "kernels warmed in" in line
    assert "loading tty.gguf" in err  # the rich progress bar drew while the weights loaded
    rc, out, err = _run_on_a_tty([p, "hi", "--max-tokens", "2", "--json"])
    assert rc == 0 and json.loads(out)["prompt_ids"]
    assert "fak: " not in err and "loading" not in err
    r = fak(p, "hi", "--max-tokens", "2")  # stderr not a terminal: no boot line either
    assert r.returncode == 0 and "fak: " not in r.stderr and "decode: " in r.stderr


@pytest.mark.slow
def test_plain_boot_line_says_float32(tmp_path: Path) -> None:
    p = str(tiny_chat_gguf(tmp_path / "plain.gguf", TEMPLATE))
    rc, _, err = _run_on_a_tty([p, "hi", "--max-tokens", "1", "--plain"])
    assert rc == 0 and " · float32 " in err


@pytest.mark.parametrize("args", [["--gguf", "/no/such.gguf", "hi"], ["/no/such.gguf", "hi"],
                                  ["--gguf", str(REPO / "tests"), "hi"], ["--plain", "--q4k", "synthetic", "hi"],
                                  ["--gguf", "synthetic", "a", "b"]])
def test_bad_model_is_one_line_exit_2(args: list[str]) -> None:
    r = fak(*args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fak: error: "), r.stderr


@pytest.mark.slow
def test_gguf_flag_is_the_model(tmp_path: Path) -> None:
    a = fak("--gguf", "synthetic", "hi", "--json", "--max-tokens", "3")
    b = fak("synthetic", "hi", "--json", "--max-tokens", "3")
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    assert json.loads(a.stdout)["generated_ids"] == json.loads(b.stdout)["generated_ids"]


def test_boot_api_builds_one_scheduler_and_closes() -> None:
    from engine.sched.lane import Request
    from fak.runtime.boot import SchedOptions, boot

    b = boot("synthetic", sched=SchedOptions.resolve(env=False, max_running=2, block_tokens=8), show=False)
    try:
        assert b.scheduler.max_running == 2 and b.scheduler.pool.block_tokens == 8
        assert b.text_ok and b.tokenizer.encode("ab") == [97, 98]
        h = b.scheduler.admit(Request([1, 2, 3], max_new_tokens=4))
        assert len(h.result(timeout=60).token_ids) == 4
    finally:
        b.close()
    assert b.scheduler._thread is not None and not b.scheduler._thread.is_alive()


@pytest.mark.gemma
def test_one_thread_runs_the_kernels_when_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """boot() as `fak serve` runs it: the scheduler's loop thread warms the kernels and runs every parallel
    one, the booting thread none (a second launching thread gets its own OpenMP team, and on 2 cores every
    launch then waits for a worker's wake-up: engine/kernels/parallel.py)."""
    import threading

    from engine.kernels import parallel
    from engine.sched.lane import Request
    from fak.runtime.boot import SchedOptions, boot

    monkeypatch.setattr(parallel, "_launchers", set())  # a thread's ident is reused once it ends: start afresh
    b = boot("gemma3-270m", sched=SchedOptions.resolve(env=False, kv_cache_dir="off", speculative="ngram"), show=False)
    try:
        prompt = list(range(40, 140))
        assert len(b.scheduler.admit(Request(prompt * 2, max_new_tokens=6)).result(timeout=120).token_ids) == 6
        loop = b.scheduler._thread
        assert loop is not None and parallel.launchers() == {loop.ident}  # big enough to run parallel kernels
        assert threading.get_ident() != loop.ident
    finally:
        b.close()
