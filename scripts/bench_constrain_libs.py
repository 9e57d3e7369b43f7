"""Compare constrained-decoding libraries by the time they take to compute the mask of allowed
next tokens, on a real vocabulary, for a JSON schema, a GBNF grammar and a regex.

    python scripts/bench_constrain_libs.py VOCAB.gguf [VOCAB.gguf ...] [-r 3]

VOCAB is any GGUF with a tokenizer (a model, or a vocabulary-only file such as llama.cpp's
models/ggml-vocab-qwen2.gguf, 151,936 tokens). Each library that imports is measured:
llguidance, xgrammar and outlines-core (install them into a scratch environment; xgrammar's
PyPI wheel pulls in torch with CUDA). For each workload a text the grammar accepts is tokenized
with edgellm's tokenizer and walked token by token: compute the mask (timed), then accept the
token. Printed: grammar compile time (with the first matcher), the first mask, and every later
mask's time (median, mean, 90th percentile, max) in microseconds over every round. Nothing here decides anything: it measures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from edgellm.gguf_file import GGUFFile
from edgellm.tokenizer import Tokenizer
from edgellm.tokenizer.vocab import Attr

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z0-9._]+@[a-z0-9]+\\.[a-z]{2,4}$"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "email", "tags", "address"],
    "additionalProperties": False,
}
SCHEMA_TEXT = ('{"name": "Ada Lovelace, Countess of Lovelace", "age": 36, "email": "ada.lovelace@example.org", '
               '"tags": ["red", "blue"], "address": {"city": "London, Marylebone", "zip": "12345"}}')

JSON_GBNF = r'''root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= (" " | "\n" [ \t]{0,20})?
'''
# (llama.cpp's json.gbnf writes ws with an empty first alternative, "ws ::= | ...", which
# xgrammar's parser rejects; this form means the same to every library)
GBNF_TEXT = ('{"id": 17, "items": [{"sku": "A-113", "qty": 2, "price": 9.5}, {"sku": "B-7", "qty": 1, '
             '"price": 120}], "note": "deliver after 5 pm", "gift": false}')

REGEX = r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun), [0-9]{1,2} [A-Z][a-z]+ [0-9]{4} at [0-9]{2}:[0-9]{2} \((UTC|CET|EST)\)"
REGEX_TEXT = "Wed, 14 February 2024 at 09:30 (CET)"

WORKLOADS = [("json_schema", SCHEMA_TEXT), ("gbnf", GBNF_TEXT), ("regex", REGEX_TEXT)]


def load_vocab(path: str):
    g = GGUFFile(path)
    tok = Tokenizer.from_metadata(g.metadata)
    hidden = int(Attr.CONTROL | Attr.UNKNOWN | Attr.UNUSED | Attr.UNDEFINED)
    attrs = tok.vocab.attrs
    special = [(int(a) & hidden) != 0 or (int(a) & int(Attr.NORMAL | Attr.BYTE | Attr.USER_DEFINED)) == 0
               for a in attrs]
    pieces = [tok.token_bytes(i) for i in range(tok.n_vocab)]
    return tok, pieces, special


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok, pieces, special):
        import llguidance
        from llguidance._tokenizer import TokenizerWrapper

        class Wrapped:
            eos_token_id = tok.eos_id
            bos_token_id = tok.bos_id
            tokens = [b"\xff" + p if s else p for p, s in zip(pieces, special)]
            special_token_ids = [i for i, s in enumerate(special) if s]

            def __call__(self, s):
                return tok.encode(s.decode("utf-8", "replace") if isinstance(s, bytes) else s, add_bos=False)

        self.ll = llguidance
        self.lltok = llguidance.LLTokenizer(TokenizerWrapper(Wrapped()))
        self.n = tok.n_vocab
        self.mask = np.zeros((self.n + 31) // 32, dtype=np.int32)

    def compile(self, kind):
        g = {"json_schema": lambda: self.ll.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA)),
             "gbnf": lambda: self.ll.grammar_from("gbnf", JSON_GBNF),
             "regex": lambda: self.ll.LLMatcher.grammar_from_regex(REGEX)}[kind]()
        return g

    def matcher(self, g):
        m = self.ll.LLMatcher(self.lltok, g, log_level=0)
        assert not m.is_error(), m.get_error()
        return m

    def fill(self, m):
        m.unsafe_compute_mask_ptr(self.mask.ctypes.data, self.mask.nbytes)

    def allowed(self, tid):
        return bool((self.mask[tid >> 5] >> (tid & 31)) & 1)

    def accept(self, m, tid):
        assert m.consume_token(tid), m.get_error()


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok, pieces, special):
        import xgrammar as xgr

        self.xgr = xgr
        vocab = [b"" if s else p for p, s in zip(pieces, special)]
        info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=tok.n_vocab,
                                 stop_token_ids=sorted(tok.eog_ids))
        self.compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        self.mask = xgr.allocate_token_bitmask(1, tok.n_vocab)

    def compile(self, kind):
        c = self.compiler
        return {"json_schema": lambda: c.compile_json_schema(json.dumps(SCHEMA), any_whitespace=True),
                "gbnf": lambda: c.compile_grammar(JSON_GBNF),
                "regex": lambda: c.compile_regex(REGEX)}[kind]()

    def matcher(self, g):
        return self.xgr.GrammarMatcher(g)

    def fill(self, m):
        m.fill_next_token_bitmask(self.mask)

    def allowed(self, tid):
        return bool((int(self.mask[0, tid >> 5]) >> (tid & 31)) & 1)

    def accept(self, m, tid):
        assert m.accept_token(tid)


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tok, pieces, special):
        import outlines_core as oc

        self.oc = oc
        eos = tok.eos_id
        table: dict[bytes, list[int]] = {}
        for i, (p, s) in enumerate(zip(pieces, special)):
            if not s and p and i != eos:
                table.setdefault(p, []).append(i)
        self.vocab = oc.Vocabulary(eos, table)
        self.mask = np.zeros((1, (tok.n_vocab + 31) // 32), dtype=np.int32)

    def compile(self, kind):
        if kind == "gbnf":
            return None  # outlines-core has regular languages only (regex, JSON schema via regex)
        regex = (self.oc.json_schema.build_regex_from_schema(json.dumps(SCHEMA), whitespace_pattern=r"[ ]?")
                 if kind == "json_schema" else REGEX)
        return self.oc.Index(regex, self.vocab)

    def matcher(self, index):
        return self.oc.Guide(index)

    def fill(self, m):
        m.write_mask_into(self.mask.ctypes.data, self.mask.size, self.mask.itemsize)

    def allowed(self, tid):
        return bool((int(self.mask[0, tid >> 5]) >> (tid & 31)) & 1)

    def accept(self, m, tid):
        m.advance(tid)


LIBS = [LLGuidance, XGrammar, OutlinesCore]


def run(lib, tok, rounds: int):
    """Per workload: (kind, seconds to compile and build the first matcher, seconds of the first
    mask, seconds of every later mask)."""
    rows = []
    for kind, text in WORKLOADS:
        t0 = time.perf_counter()
        g = lib.compile(kind)
        if g is None:
            rows.append((kind, None, None, None))
            continue
        m = lib.matcher(g)
        compile_s = time.perf_counter() - t0
        ids = tok.encode(text, add_bos=False)
        first, times = None, []
        for r in range(rounds):
            if r:
                m = lib.matcher(g)
            for tid in ids:
                t1 = time.perf_counter()
                lib.fill(m)
                dt = time.perf_counter() - t1
                if first is None:
                    first = dt
                else:
                    times.append(dt)
                assert lib.allowed(tid), f"{lib.name} {kind}: token {tid} {tok.token_bytes(tid)!r} masked out"
                lib.accept(m, tid)
        rows.append((kind, compile_s, first, times))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("vocab", nargs="+", help="GGUF files with a tokenizer")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    args = ap.parse_args()
    print("| vocabulary | library | workload | compile ms | first mask us | mask us median | mean | p90 | max |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for path in args.vocab:
        tok, pieces, special = load_vocab(path)
        label = f"{path.rsplit('/', 1)[-1]} ({tok.n_vocab})"
        for cls in LIBS:
            try:
                t0 = time.perf_counter()
                lib = cls(tok, pieces, special)
                init = time.perf_counter() - t0
            except ImportError as e:
                print(f"| {label} | {cls.name} | not installed ({e}) | | | | | | |")
                continue
            print(f"| {label} | {cls.name} | tokenizer set-up | {init * 1e3:.0f} | | | | | |", flush=True)
            for kind, compile_s, first, times in run(lib, tok, args.rounds):
                if times is None:
                    print(f"| {label} | {cls.name} | {kind} | unsupported | | | | | |")
                    continue
                us = sorted(t * 1e6 for t in times)
                print(f"| {label} | {cls.name} | {kind} | {compile_s * 1e3:.0f} | {first * 1e6:.0f} "
                      f"| {statistics.median(us):.0f} | {statistics.fmean(us):.0f} "
                      f"| {us[int(0.9 * (len(us) - 1))]:.0f} | {us[-1]:.0f} |", flush=True)


if __name__ == "__main__":
    main()
