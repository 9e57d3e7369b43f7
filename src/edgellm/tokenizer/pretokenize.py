"""BPE pre-tokenizers: split text into words before the merges, chosen by `tokenizer.ggml.pre`.

Each pre-tokenizer is a list of regular expressions applied in turn, as llama.cpp's
unicode_regex_split does: every expression splits each piece left by the previous one into its
matches and the text between them. The expressions are those of llama.cpp's llm_tokenizer_bpe
(src/llama-vocab.cpp) in the form llama.cpp actually runs them:
- the case-insensitive contractions `(?i:'s|...)` are spelt `'[sS]|...`;
- the gpt2 expression ends in `|\\s+`, as llama.cpp's hand-written gpt2 splitter behaves;
- `$` is end of the piece (ECMAScript has no "before a final newline"), so written `\\Z`.
`\\s` in the `regex` module is the same set of 25 code points as llama.cpp's whitespace table
(unicode_set_whitespace). The letter/number/... classes come from the `regex` module's Unicode
database, which may be a version or two older than llama.cpp's tables: characters assigned in the
newest Unicode versions can be classed differently.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import regex

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# o200k's (GPT-4o, Phi-4-mini): words split at lower-to-upper case changes. llama.cpp spells the
# case classes as lookaheads: a letter that is not a-z (an "upper" one) and a letter that is not A-Z
# (a "lower" one), so a letter outside ASCII counts as both, as in its collapsed-text matching
_GPT4O_UPPER, _GPT4O_LOWER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?" + _GPT4O_UPPER + "*" + _GPT4O_LOWER + "+" + _CONTRACTIONS + "?"
    + r"|[^\r\n\p{L}\p{N}]?" + _GPT4O_UPPER + "+" + _GPT4O_LOWER + "*" + _CONTRACTIONS + "?"
    + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK = r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"

# pre-tokenizer type -> expressions, in the order applied
PATTERNS: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}$+<=>^~|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (_GPT2,),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "qwen35": (_QWEN35,),
    "gpt4o": (_GPT4O,),
    "gemma4": (r"[^\n]+|[\n]+",),
    "starcoder": (r"\p{N}", _GPT2),
    "falcon": (r"[\p{P}$+<=>^~|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "deepseek-llm": (
        r"[\r\n]",
        r"\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
        r"\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
        r"\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
        r"\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15"
        r"\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
        r"\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb"
        r"\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124"
        r"\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
        r"\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f"
        r"\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a"
        r"\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
        r"\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+\Z",
        _CJK,
        r"\p{N}+",
    ),
}


@dataclass(frozen=True)
class PreFlags:
    """What a `tokenizer.ggml.pre` value changes besides the expressions (llama_vocab::impl::load)."""

    ignore_merges: bool = False  # a pre-token that is already a token is not merged
    add_bos: bool = False        # default of tokenizer.ggml.add_bos_token
    no_bos: bool = False         # the vocabulary has no default BOS id
    force_bos: bool = False      # BOS is added even when tokenizer.ggml.add_bos_token says false
    byte_map: bool = True        # False: raw UTF-8 with spaces written as ▁ (SPM-style BPE) and
                                 # <0xAB> byte tokens for what no token covers; a run of newlines
                                 # that is a token is taken whole


_PLAIN = PreFlags()
_LLAMA3_FLAGS = PreFlags(ignore_merges=True, add_bos=True)

# tokenizer.ggml.pre value -> (pre-tokenizer type, flags), as llama_vocab::impl::load maps them
NAMES: dict[str, tuple[str, PreFlags]] = {
    "default": ("default", _PLAIN),
    **{n: ("llama3", _LLAMA3_FLAGS) for n in (
        "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
        "jina-v5-nano")},
    "dbrx": ("llama3", _PLAIN),
    "smaug-bpe": ("llama3", _PLAIN),
    "chatglm-bpe": ("llama3", PreFlags(no_bos=True)),
    "glm4": ("llama3", PreFlags(ignore_merges=True, no_bos=True)),
    "glm5": ("llama3", PreFlags(ignore_merges=True, no_bos=True)),
    "deepseek-llm": ("deepseek-llm", _PLAIN),
    "deepseek-coder": ("deepseek-coder", _PLAIN),
    "falcon": ("falcon", _PLAIN),
    **{n: ("gpt2", _PLAIN) for n in (
        "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
        "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "trillion",
        "granite-docling", "exaone4")},
    **{n: ("starcoder", _PLAIN) for n in (
        "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2")},
    **{n: ("qwen2", _PLAIN) for n in (
        "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open",
        "grok-2")},
    "qwen35": ("qwen35", _PLAIN),
    "gpt-4o": ("gpt4o", _PLAIN),
    **{n: ("gemma4", PreFlags(force_bos=True, byte_map=False)) for n in ("gemma4", "granite-embed-multi-311m")},
}


def resolve(name: str) -> tuple[str, PreFlags]:
    """Pre-tokenizer type and flags for a `tokenizer.ggml.pre` value. A missing or unknown value
    falls back to "default" with a warning: tokenization may then differ from the model's."""
    if name in NAMES:
        return NAMES[name]
    what = "missing" if not name else f"{name!r} is not supported"
    warnings.warn(
        f"BPE pre-tokenizer (tokenizer.ggml.pre) {what}; using 'default': text may tokenize differently "
        f"than the model was trained. Supported: {', '.join(sorted(NAMES))}",
        stacklevel=4,
    )
    return NAMES["default"]


# llama.cpp matches its expressions against a copy of the text in which every non-ASCII
# whitespace character is U+000B (std::regex knows only ASCII whitespace), so such characters
# never match a literal range like [\u3000-\u3002]; splitting a copy made the same way keeps the
# splits identical.
_NON_ASCII_SPACE = {
    c: "\x0b" for c in (0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000)
}

# Code points first assigned in Unicode 16.0 and 17.0. llama.cpp's character tables (Unicode 15.1)
# class them as unassigned, the `regex` module's (up to 17.0) as letters, digits, marks, ...; for
# expressions using those classes they are replaced by U+0378, a code point never assigned.
_NEWER_THAN_15_1 = (
    "["
    r"\u0558\u058b-\u058c\u05c8-\u05c9\u088f\u0897\u0b53-\u0b54\u0c5c\u0cdc\u1acf-\u1af0\u1b4e-\u1b4f"
    r"\u1b7f\u1c89-\u1c8a\u208f\u209d-\u209f\u20c1-\u20c4\u2427-\u2429\u2b96\u2e60-\u2e63\u31e4-\u31e5"
    r"\ua7cb-\ua7cf\ua7d2\ua7d4\ua7da-\ua7dd\ua7e2\ua7f1\uab6c-\uab6d\ufbc3-\ufbd2\ufd90-\ufd91"
    r"\ufdc8-\ufdce\U000105c0-\U000105f3\U000107bb-\U000107bf\U00010940-\U00010959"
    r"\U00010d40-\U00010d65\U00010d69-\U00010d85\U00010d8e-\U00010d8f\U00010ec2-\U00010ec7"
    r"\U00010ec9-\U00010eee\U00010ef0-\U00010efc\U00011380-\U00011389\U0001138b\U0001138e"
    r"\U00011390-\U000113b5\U000113b7-\U000113c0\U000113c2\U000113c5\U000113c7-\U000113ca"
    r"\U000113cc-\U000113d5\U000113d7-\U000113d8\U000113e1-\U000113e2\U000116d0-\U000116e3\U00011b0a"
    r"\U00011b60-\U00011b67\U00011bc0-\U00011be1\U00011bf0-\U00011bf9\U00011db0-\U00011ddb"
    r"\U00011de0-\U00011de9\U00011df0-\U00011df1\U00011f5a\U0001246f\U00012475-\U0001247f"
    r"\U00012550-\U00012686\U00013460-\U000143fa\U00016100-\U00016139\U00016d40-\U00016d79"
    r"\U00016ea0-\U00016eb8\U00016ebb-\U00016ed3\U00016ff2-\U00016ff6\U000187f8-\U000187ff"
    r"\U00018cd6-\U00018cda\U00018cff\U00018d09-\U00018d20\U00018d80-\U00018df2\U00018e00-\U00019191"
    r"\U000191a0-\U000191d2\U0001b123-\U0001b128\U0001b168\U0001cc00-\U0001ccfc\U0001cd00-\U0001ceb3"
    r"\U0001ceba-\U0001ced0\U0001ced2-\U0001ced4\U0001cedd-\U0001cefd\U0001d127-\U0001d128"
    r"\U0001d1eb-\U0001d1ff\U0001d250-\U0001d281\U0001d6a6\U0001db00-\U0001db1c\U0001df1f-\U0001df24"
    r"\U0001df2b-\U0001df81\U0001df90-\U0001df96\U0001dfcd-\U0001dfff\U0001e5d0-\U0001e5fa\U0001e5ff"
    r"\U0001e6c0-\U0001e6de\U0001e6e0-\U0001e6f5\U0001e6fe-\U0001e6ff\U0001f1ae\U0001f6d8-\U0001f6d9"
    r"\U0001f777-\U0001f77a\U0001f7da-\U0001f7db\U0001f7f1-\U0001f7ff\U0001f8b2-\U0001f8bb"
    r"\U0001f8c0-\U0001f8c1\U0001f8d0-\U0001f8d8\U0001fa54-\U0001fa57\U0001fa89-\U0001fa8f\U0001fabe"
    r"\U0001fac6\U0001fac8\U0001facc-\U0001facd\U0001fadc-\U0001fadd\U0001fadf\U0001fae9-\U0001faeb"
    r"\U0001faef\U0001faf9-\U0001fafa\U0001fbcb-\U0001fbef\U0001fbfa\U0002b73a-\U0002b73f\U0002b81e"
    r"\U0002cea2-\U0002cead\U000323b0-\U00033479\U0003d000-\U0003fc3f"
    "]"
)


class Splitter:
    """Splits text into pre-tokens with one pre-tokenizer's expressions."""

    def __init__(self, pre_type: str):
        self._regexes = _compiled(pre_type)

    def split(self, text: str) -> list[str]:
        if text.isascii():
            literal = classes = text
        else:
            literal = text.translate(_NON_ASCII_SPACE)
            classes = _newer_chars().sub("\u0378", literal)
        spans = [(0, len(text))]
        for rx, uses_classes in self._regexes:
            shadow = classes if uses_classes else literal
            out: list[tuple[int, int]] = []
            for start, end in spans:
                pos = start
                for m in rx.finditer(shadow, start, end):
                    a, b = m.span()
                    if a > pos:
                        out.append((pos, a))
                    out.append((a, b))
                    pos = b
                if pos < end:
                    out.append((pos, end))
            spans = out
        return [text[a:b] for a, b in spans]


@functools.lru_cache(maxsize=None)
def _compiled(pre_type: str) -> tuple[tuple[regex.Pattern, bool], ...]:
    """(expression, whether it uses Unicode classes) for each expression of a pre-tokenizer."""
    import regex  # here, not at the top: SPM vocabularies never split (the module is ~1.7 MB resident)

    return tuple((regex.compile(p), r"\p{" in p) for p in PATTERNS[pre_type])


@functools.lru_cache(maxsize=None)
def _newer_chars() -> regex.Pattern:
    import regex

    return regex.compile(_NEWER_THAN_15_1)
