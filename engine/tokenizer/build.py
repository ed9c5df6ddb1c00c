"""GGUF vocabulary -> HF `tokenizers.Tokenizer` (byte-level BPE or SentencePiece-style BPE).

Two shapes, as llama.cpp reads them (`tokenizer.ggml.model`):
- "gpt2": byte-level BPE from tokens + merges, text first split by the regexes of the model's
  pre-tokenizer (`tokenizer.ggml.pre`), then mapped to the GPT-2 byte alphabet.
- "llama": SentencePiece BPE. The file has no merges, only scores: a pair (a, b) merges when a, b
  and a+b are all tokens, best a+b first; spaces become U+2581; characters without a token fall
  back to <0xXX> byte tokens; with add_space_prefix a U+2581 is put in front of the text.

The build is split in two: `plan_tokenizer` does the slow part (reading merges or deriving them
from scores) into a `TokenizerPlan` of plain arrays that caches well, and `assemble` turns a plan
into a `tokenizers.Tokenizer` (constructing the Rust BPE from Python objects is ~4x faster than
parsing the same model from tokenizer.json).

Control (and unknown) tokens become special added tokens: matched in text only when the caller
asks (`encode_special_tokens` is switched off). User-defined tokens are always matched whole,
like llama.cpp's `tokenizer_st_partition` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from engine.errors import EngineError
from engine.tokenizer.vocab import CONTROL, UNKNOWN, USER_DEFINED, VocabMeta

SPIECE_SPACE = "\u2581"

# Pre-tokenizer regexes (Oniguruma syntax, as in the models' own tokenizer.json), applied in
# sequence: each splits the pieces the previous one left, and unmatched text stays a piece.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CHATGLM4 = _QWEN2.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTION +
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTION +
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PORO = r" ?[^(\s|.,!?…。，、।۔،)]+"
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_JAIS2 = _LLAMA3.replace(r"|\s+(?!\S)|\s+", "|" + "|".join(rf"\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
                         + r"|\s{1,2}(?!\S)|\s{1}")
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_YOUTU_CJK = r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+"
_YOUTU = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
          rf"{_CONTRACTIONS}?|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_BAILING = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]"
            r"|\s+(?!\S)|\s+")  # possessive quantifiers, as in its tokenizer.json (Oniguruma has them)
_SEED_CODER = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
_UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_EXAONE_MOE = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+")
_MINICPM5 = _QWEN2.replace(r"|\p{N}|", r"|\p{N}+|")
_CJK = r"[一-龥ࠀ-一가-퟿]+"
# DeepSeek LLM's letter class: the cased letters (Lu, Ll, Lt) of its tokenizer.json, as code point
# ranges (written as numbers: several of these characters change under Unicode normalization).
_DEEPSEEK_CASED = (
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF),
    (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377), (0x37B, 0x37D), (0x37F, 0x37F),
    (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C), (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481),
    (0x48A, 0x52F), (0x531, 0x556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102),
    (0x2107, 0x2107), (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126),
    (0x2128, 0x2128), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149),
    (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF3),
    (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF),
    (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F),
    (0x104B0, 0x104D3), (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF),
    (0x1E900, 0x1E943),
)
_DEEPSEEK_LETTERS = r"\s?[" + "".join(f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in _DEEPSEEK_CASED) + "]+"
_DEEPSEEK3_MAIN = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                   r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPARK25_MAIN = _DEEPSEEK3_MAIN.replace(r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|", r"| ?[\p{P}\p{S}]+|[\r\n]|")


def _names(*names: str, splits: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    return {n: splits for n in names}


PRE_SPLITS: dict[str, tuple[str, ...]] = {
    **_names("default", splits=(r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")),
    **_names("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
             "dbrx", "smaug-bpe", "jina-v5-nano", splits=(_LLAMA3,)),
    **_names("jais-2", splits=(_JAIS2,)),
    **_names("deepseek-llm", splits=(r"[\r\n]", _DEEPSEEK_LETTERS, r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
                                     r"\s+$", _CJK, r"\p{N}+")),
    **_names("deepseek-coder", splits=(r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")),
    **_names("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4",
             splits=(r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", _DEEPSEEK3_MAIN)),
    **_names("spark2_5", splits=(r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", _SPARK25_MAIN, r"\p{N}")),
    **_names("falcon", splits=(r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
    **_names("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2",
             splits=(r"\p{N}", _GPT2)),
    # gpt-neox: GPT-NeoX's tokenizer.json uses the plain GPT-2 byte-level split.
    **_names("gpt-2", "gpt-neox", "mpt", "olmo", "jais", "phi-2", "jina-es", "jina-de", "jina-v2-es",
             "jina-v2-de", "jina-v1-en", "jina-v2-code", "roberta-bpe", "trillion", "granite-docling",
             "exaone4", "mellum", "gigachat", "a.x-4.0", "modern-bert", splits=(_GPT2,)),
    **_names("qwen2", "qwen2.5", "stablelm2", "deepseek-r1-qwen", "megrez", "hunyuan", "kormo", "f2llmv2",
             "solar-open", "grok-2", splits=(_QWEN2,)),
    **_names("qwen35", splits=(_QWEN35,)),
    **_names("laguna", splits=(r"[^\n]+|[\n]+", _QWEN2)),
    **_names("minicpm5", splits=(r"\p{N}{1,3}", _MINICPM5)),
    **_names("chatglm-bpe", "glm4", "glm5", splits=(_CHATGLM4,)),
    **_names("youtu", splits=(_YOUTU_CJK, _YOUTU)),
    **_names("bailingmoe", "bailingmoe2", "llada-moe", splits=(_BAILING,)),
    **_names("seed-coder", splits=(_SEED_CODER,)),
    **_names("ufakzeka", splits=(_UFAKZEKA,)),
    **_names("exaone-moe", splits=(_EXAONE_MOE,)),
    **_names("chameleon", splits=(r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )",
                                  r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", _GPT2)),
    **_names("superbpe", splits=(r"\p{N}+", r"(?=(\d{3})+(?!\d))")),  # digits in threes from the right
    **_names("tiny_aya", "cohere2moe", splits=(r"\d{1,3}(?=(?:\d{3})*\b)", _GPT4O)),
    **_names("poro-chat", "bloom", "gpt3-finnish", splits=(_PORO,)),
    **_names("viking", splits=(_PORO, r"\p{N}")),
    **_names("tekken", splits=(_TEKKEN,)),
    **_names("gpt-4o", "llama4", "minimax-m2", "kanana2", "talkie", "granite-embed-multi-97m", splits=(_GPT4O,)),
}
# llama.cpp knows these too, but does not split them by regexes over GPT-2 bytes: SentencePiece-style BPE on
# raw UTF-8 (gemma4, sarvam-moe, mmbert, granite-embed-multi-311m, whitespace) or its own code (kimi-k2's Han
# handling, afmoe's digit grouping). A clear error, not a wrong split.
UNSUPPORTED_PRE = {"gemma4", "granite-embed-multi-311m", "sarvam-moe", "mmbert", "whitespace", "kimi-k2", "afmoe"}

# llama.cpp: these look a whole pre-token up in the vocabulary before merging (HF `ignore_merges`).
IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                 "lfm2", "tekken", "jina-v5-nano", "minicpm5", "youtu", "glm5", "granite-embed-multi-97m"}
# llama.cpp adds BOS for these even when the file does not say so.
ADD_BOS_PRE = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
               "lfm2", "tekken", "jina-v5-nano", "chameleon"}
# transformers' GGUF loader: Gemma's merge order is the token order, not the scores.
RANK_BY_ID_ARCHS = {"gemma", "gemma2", "gemma3"}


@dataclass
class TokenizerPlan:
    """Everything `assemble` needs; small fields go to JSON, merges to an int32 array."""

    kind: str                        # "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE)
    pre: str
    respelled: dict[int, str]        # token id -> spelling the BPE model uses (if not the GGUF's)
    merges: np.ndarray               # (n, 2) int32 token ids, best merge first
    added: list[tuple[int, bool]]    # (token id, special) matched whole in text
    unk_id: int | None
    add_space_prefix: bool

    def spelled(self, tokens: list[str]) -> list[str]:
        if not self.respelled:
            return tokens
        out = list(tokens)
        for i, t in self.respelled.items():
            out[i] = t
        return out


def _first_ids(tokens: list[str]) -> dict[str, int]:
    vocab = dict(zip(tokens, range(len(tokens)), strict=False))
    if len(vocab) != len(tokens):  # duplicates (llama.cpp rejects them): the first id wins
        vocab = dict(zip(reversed(tokens), range(len(tokens) - 1, -1, -1), strict=False))
    return vocab


def _added(meta: VocabMeta, spelled: list[str], vocab: dict[str, int]) -> list[tuple[int, bool]]:
    out: list[tuple[int, bool]] = []
    for i, (tok, ttype) in enumerate(zip(spelled, meta.types, strict=False)):
        if vocab.get(tok) != i:
            continue
        if ttype in (CONTROL, UNKNOWN):
            out.append((i, True))
        elif ttype == USER_DEFINED and tok == meta.tokens[i]:  # respelled ones are left to BPE
            out.append((i, False))
    return out


def _pairs(pairs: list[tuple[int, int]]) -> np.ndarray:
    return np.asarray(pairs, dtype=np.int32).reshape(-1, 2)


def spm_spelling(meta: VocabMeta) -> dict[int, str]:
    """A token of only spaces is stored with real spaces in Gemma files but looked up after
    spaces became U+2581, so it is respelled (unless that clashes with another token)."""
    present = set(meta.tokens)
    out: dict[int, str] = {}
    for i, t in enumerate(meta.tokens):
        if " " in t and not t.strip():
            alt = SPIECE_SPACE * len(t)
            if alt not in present:
                out[i] = alt
    return out


def spm_merges(spelled: list[str], vocab: dict[str, int], rank: list[float]) -> np.ndarray:
    """Every split (a, b) of a token t with a and b tokens, best t first (higher `rank`), then
    longer a, then longer b; splits of one t in (id a, id b) order -- transformers' order."""
    ranks: list[float] = []
    len_a: list[int] = []
    len_b: list[int] = []
    ids_a: list[int] = []
    ids_b: list[int] = []
    get = vocab.get
    for t, i in vocab.items():
        n = len(t)
        if n < 2:
            continue
        local = []
        for k in range(1, n):
            ia = get(t[:k])
            if ia is not None:
                ib = get(t[k:])
                if ib is not None:
                    local.append((ia, ib, k))
        if local:
            local.sort()
            r = rank[i]
            for ia, ib, k in local:
                ranks.append(r)
                len_a.append(k)
                len_b.append(n - k)
                ids_a.append(ia)
                ids_b.append(ib)
    # lexsort is stable: equal keys keep the discovery order, as transformers' sorted(reverse=True) does
    order = np.lexsort((-np.asarray(len_b), -np.asarray(len_a), -np.asarray(ranks, dtype=np.float64)))
    return np.stack([np.asarray(ids_a, dtype=np.int32)[order], np.asarray(ids_b, dtype=np.int32)[order]],
                    axis=1).reshape(-1, 2)


def plan_tokenizer(meta: VocabMeta) -> TokenizerPlan:
    if meta.model == "gpt2":
        if meta.pre in UNSUPPORTED_PRE:
            raise EngineError(f"tokenizer pre-type {meta.pre!r} (tokenizer.ggml.pre) is not supported: llama.cpp "
                              f"does not split it by regexes over GPT-2 bytes (raw-UTF-8 BPE or custom code)")
        if meta.pre not in PRE_SPLITS:
            raise EngineError(f"unknown tokenizer pre-type {meta.pre!r} (tokenizer.ggml.pre); "
                              f"known: {', '.join(sorted(PRE_SPLITS))}")
        if not meta.merges:
            raise EngineError("byte-level BPE vocabulary without tokenizer.ggml.merges")
        vocab = _first_ids(meta.tokens)
        pairs: list[tuple[int, int]] = []
        for m in meta.merges:
            cut = m.find(" ", 1)
            if cut > 0:
                a, b = vocab.get(m[:cut]), vocab.get(m[cut + 1:])
                if a is not None and b is not None:
                    pairs.append((a, b))
        return TokenizerPlan("gpt2", meta.pre, {}, _pairs(pairs), _added(meta, meta.tokens, vocab),
                             None, False)
    if meta.model == "llama":
        respelled = spm_spelling(meta)
        spelled = list(meta.tokens)
        for i, t in respelled.items():
            spelled[i] = t
        vocab = _first_ids(spelled)
        if meta.arch in RANK_BY_ID_ARCHS or meta.scores is None:
            rank = [-float(i) for i in range(len(spelled))]
        else:
            rank = [float(s) for s in meta.scores[: len(spelled)].tolist()]
        return TokenizerPlan("llama", meta.pre, respelled, spm_merges(spelled, vocab, rank),
                             _added(meta, spelled, vocab), meta.unk_id, meta.add_space_prefix)
    raise EngineError(f"unsupported tokenizer model {meta.model!r} (tokenizer.ggml.model); "
                      "supported: gpt2, llama")


def assemble(plan: TokenizerPlan, tokens: list[str]) -> Tokenizer:
    """The `tokenizers.Tokenizer` a plan describes (`tokens`: the GGUF's token texts)."""
    spelled = plan.spelled(tokens)
    vocab = _first_ids(spelled)
    names = np.array(spelled, dtype=object)[plan.merges]  # (n, 2) of str, gathered in C
    merges = list(zip(names[:, 0].tolist(), names[:, 1].tolist(), strict=False))
    if plan.kind == "gpt2":
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=plan.pre in IGNORE_MERGES))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_SPLITS[plan.pre]]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
    else:
        unk = spelled[plan.unk_id] if plan.unk_id is not None else None
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True,
                                   byte_fallback=True))
        replace = normalizers.Replace(" ", SPIECE_SPACE)
        tok.normalizer = (normalizers.Sequence([normalizers.Prepend(SPIECE_SPACE), replace])
                          if plan.add_space_prefix else replace)
        steps = [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        if plan.add_space_prefix:
            steps.append(decoders.Strip(" ", 1, 0))
        tok.decoder = decoders.Sequence(steps)
    tok.add_tokens([AddedToken(spelled[i], special=special, normalized=False) for i, special in plan.added])
    return tok


def build_tokenizer(meta: VocabMeta) -> Tokenizer:
    return assemble(plan_tokenizer(meta), meta.tokens)
