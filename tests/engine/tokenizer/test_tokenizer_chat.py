"""Chat templates (transformers' renderer as oracle), ByteTokenizer, and load_tokenizer("byte")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import EngineError
from engine.tokenizer.chat_template import CHATML_TEMPLATE, GEMMA_TEMPLATE, LLAMA3_TEMPLATE, render_chat
from engine.tokenizer.tokenizer import ByteTokenizer, load_gguf_tokenizer, load_tokenizer
from support.vocab import vocab_dir

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file: ünïcode",
                                           "parameters": {"type": "object", "properties": {
                                               "path": {"type": "string"}}, "required": ["path"]}}}]
CONVOS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi \n"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "日本"}],
    [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " look "}]}],
]


def _hf_render(template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True, **special: str) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                        add_generation_prompt=add_generation_prompt, **special)
    return rendered[0]


@pytest.mark.oracle
@pytest.mark.parametrize("template", [GEMMA_TEMPLATE, CHATML_TEMPLATE, LLAMA3_TEMPLATE],
                         ids=["gemma", "chatml", "llama3"])
def test_builtin_templates_render_like_transformers(template: str) -> None:
    special = {"bos_token": "<BOS>", "eos_token": "<EOS>"}
    for i, convo in enumerate(CONVOS):
        if template is not GEMMA_TEMPLATE and not all(isinstance(m["content"], str) for m in convo):
            continue
        for gen in (True, False):
            for tools in (None, TOOLS):
                ours = render_chat(template, convo, add_generation_prompt=gen, tools=tools, special=special)
                assert ours == _hf_render(template, convo, tools, gen, **special), (i, gen, tools)


def test_builtin_templates_exact_text() -> None:
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert render_chat(CHATML_TEMPLATE, msgs) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n")
    assert render_chat(LLAMA3_TEMPLATE, msgs, special={"bos_token": "<|begin_of_text|>"}) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert render_chat(GEMMA_TEMPLATE, msgs, add_generation_prompt=False, special={"bos_token": "<bos>"}) == (
        "<bos><start_of_turn>user\nS\n\nU<end_of_turn>\n")
    with_tools = render_chat(CHATML_TEMPLATE, msgs[1:], tools=TOOLS)
    assert with_tools.startswith("<|im_start|>system\nYou can call these tools") and '"read_file"' in with_tools
    assert "ünïcode" in with_tools  # tojson keeps unicode, like transformers


@pytest.mark.oracle
def test_gguf_template_used_and_rendered_like_transformers() -> None:
    qwen = load_gguf_tokenizer(vocab_dir() / "ggml-vocab-qwen2.gguf", use_cache=False)
    assert qwen.info.chat_template and qwen.chat_template == qwen.info.chat_template
    for convo in CONVOS[:3]:
        assert qwen.apply_chat_template(convo) == _hf_render(qwen.chat_template, convo, bos_token="<|endoftext|>",
                                                             eos_token="<|endoftext|>")
    ids = qwen.encode_chat(CONVOS[0])
    assert ids[0] == qwen.token_id("<|im_start|>") and qwen.token_id("<|im_end|>") in ids


def test_llama3_fallback_and_single_bos() -> None:
    llama3 = load_gguf_tokenizer(vocab_dir() / "ggml-vocab-llama-bpe.gguf", use_cache=False)
    assert llama3.info.chat_template is None and llama3.chat_template == LLAMA3_TEMPLATE
    ids = llama3.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[0] == 128000 and ids.count(128000) == 1
    assert ids[-4:] == llama3.encode("<|start_header_id|>assistant<|end_header_id|>\n\n", add_special=False,
                                     parse_special=True)


def test_template_helpers_and_sandbox() -> None:
    assert render_chat("{{ strftime_now('%Y') }}", []) == str(datetime.now().year)
    assert render_chat("{% for i in [1,2,3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}", []) == "1"
    assert render_chat("{{ tools[0].function.name }}|{{ bos_token }}", [], tools=TOOLS,
                       special={"bos_token": "<s>"}) == "read_file|<s>"
    assert render_chat("{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}",
                       [{"role": "assistant", "content": "x"}]) == "[x]"
    assert render_chat("{{ messages | tojson }}", [{"role": "user", "content": "é"}]) == (
        '[{"role": "user", "content": "é"}]')
    with pytest.raises(EngineError, match="chat template: nope"):
        render_chat("{{ raise_exception('nope') }}", [])
    with pytest.raises(EngineError, match="chat template"):
        render_chat("{% set x = [] %}{{ x.append(1) }}", [])  # immutable sandbox
    with pytest.raises(EngineError, match="chat template"):
        render_chat("{{ ''.__class__.__mro__[1].__subclasses__() }}", [])
    with pytest.raises(EngineError, match="does not compile"):
        render_chat("{% for %}", [])
    with pytest.raises(EngineError, match="list of"):
        render_chat(CHATML_TEMPLATE, [{"content": "no role"}])


def test_byte_tokenizer() -> None:
    tok = load_tokenizer("byte")
    assert isinstance(tok, ByteTokenizer) and isinstance(load_tokenizer("synthetic"), ByteTokenizer)
    assert (tok.vocab_size, tok.bos_id, tok.eos_ids) == (256, None, ())
    text = "héllo 😀\n"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and tok.encode(text, add_special=False) == ids
    assert tok.decode(ids) == text
    assert tok.token_text(65) == "A"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(tok.encode_chat([{"role": "user", "content": "hi"}])).endswith("assistant\n")
    with pytest.raises(EngineError, match="out of range"):
        tok.decode([256])


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64))
def test_byte_stream_property(data: bytes) -> None:
    tok = ByteTokenizer()
    s = tok.stream()
    pieces = [s.push(b) for b in data] + [s.flush()]
    for p in pieces:
        p.encode("utf-8")  # never a broken character
    assert "".join(pieces) == tok.decode(list(data)) == data.decode("utf-8", errors="replace")

