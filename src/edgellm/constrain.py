"""Constrained decoding: output that follows a JSON schema, a GBNF or Lark grammar, or a regex.

    g = Grammar.from_json_schema({"type": "object", ...})   # .from_gbnf(text), .from_regex(p), ...
    c = g.constraint(tokenizer)          # one per sequence
    mask = c.compute_mask()              # the tokens allowed next (a worker thread may do this)
    c.accept(token_id)                   # what was sampled
    c.forced_tokens()                    # what the grammar allows as the only continuation
    c.accepting, c.finished              # may stop here / nothing but the end may follow

A `Grammar` is compiled once and shared; a `Constraint` is one sequence's state, so a scheduler
of many sequences holds one each (compute_mask releases the GIL: masks may be computed in worker
threads while the engine evaluates). `Guide` drives one constraint in a generation loop (api.py).

The grammar engine is llguidance (Microsoft's, the one llama.cpp builds in with LLAMA_LLGUIDANCE):
an Earley parser over a lazily built lexer DFA, so a mask costs tens of microseconds on a 150k-262k
vocabulary with no per-grammar precomputation, and it reads llama.cpp's GBNF, Lark, JSON schema
and regex (scripts/bench_constrain_libs.py compares it with xgrammar and outlines-core).
"""

from __future__ import annotations

import json
import re
import weakref
from typing import Any, Sequence

import numpy as np

from .errors import GrammarError
from .sampling import probabilities
from .tokenizer.bpe import BYTE_CHARS
from .tokenizer.vocab import Attr

INSTALL_HINT = "constrained generation needs llguidance: pip install 'edgellm[structured]'"

# JSON written as json.dumps writes it: ", " between items, ": " after keys, no other whitespace.
# One way to write each object means its keys, quotes and separators are forced, so they are
# appended without sampling (jump-forward) - and small models follow a layout they know.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

# Tokens llguidance must never match as text: control, unknown, unused and undefined tokens
# (their pieces are prefixed with 0xFF, which no UTF-8 text contains, as llguidance expects).
_NOT_TEXT = int(Attr.CONTROL | Attr.UNKNOWN | Attr.UNUSED)
_TEXT = int(Attr.NORMAL | Attr.BYTE | Attr.USER_DEFINED)


_KIND_NAMES = {"json_schema": "JSON schema", "gbnf": "grammar", "lark": "Lark grammar", "regex": "regex"}


def _one_line(message: str) -> str:
    """llguidance's messages may quote the source over several lines with carets under it: keep
    the text, drop the carets and the numbered source excerpts. A matcher's error ends with a
    dump of its state and the whole grammar (`<state>...</grammar>`): dropped too."""
    keep = []
    for ln in message.split("<state>")[0].strip().splitlines():
        ln = ln.strip()
        if ln and not re.fullmatch(r"[\^~\s]+|\d+ \|.*|\|.*", ln):
            keep.append(ln)
    return " ".join(keep)


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise GrammarError(INSTALL_HINT) from None
    return llguidance


# ---------------------------------------------------------------------------------------------
# the vocabulary as llguidance sees it (built once per tokenizer: ~1-2.5 s for 50k-262k tokens)

_VOCABS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


# BPE token text -> bytes: GPT-2's printable stand-ins back to the Latin-1 characters of their bytes
_BPE_TO_LATIN1 = str.maketrans({c: chr(b) for b, c in enumerate(BYTE_CHARS)})
_SPM_SPACE = "\u2581".encode()


def _token_pieces(tokenizer) -> tuple[list[bytes], list[int]]:
    """Each token's bytes (as tokenizer.token_bytes), with the ids of the tokens that are not
    text (control and the like). Normal tokens are converted here in bulk, 2-3x faster than one
    token_bytes call each."""
    v = tokenizer.vocab
    attrs = v.attrs.tolist()
    normal, bpe = int(Attr.NORMAL), v.kind == "bpe"
    pieces, special = [], []
    for i, a in enumerate(attrs):
        if a & _NOT_TEXT or not a & _TEXT:
            pieces.append(b"\xff" + tokenizer.token_bytes(i))
            special.append(i)
        elif a & normal:
            if bpe:
                try:
                    pieces.append(v.tokens[i].translate(_BPE_TO_LATIN1).encode("latin-1"))
                except UnicodeEncodeError:  # a character outside the byte map: as the tokenizer renders it
                    pieces.append(tokenizer.token_bytes(i))
            else:
                pieces.append(v.tokens.encoded(i).replace(_SPM_SPACE, b" "))
        else:
            pieces.append(tokenizer.token_bytes(i))
    return pieces, special


def lltokenizer(tokenizer):
    """llguidance's LLTokenizer for an edgellm Tokenizer (cached while the tokenizer lives)."""
    cached = _VOCABS.get(tokenizer)
    if cached is not None:
        return cached[0]
    ll = _llguidance()
    pieces, special = _token_pieces(tokenizer)

    class Source:  # the shape llguidance.TokenizerWrapper reads
        eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eog_ids, default=0)
        bos_token_id = tokenizer.bos_id
        tokens = pieces
        special_token_ids = special

        def __call__(self, text):  # used to re-tokenize forced bytes canonically
            if isinstance(text, bytes):
                text = text.decode("utf-8", errors="surrogateescape")
            # the bytes continue the text so far: no SPM space in front of them, or llguidance
            # would force (and mask down to) a space the grammar then rejects
            return tokenizer.encode(text, add_bos=False, space_prefix=False)

    eog = sorted(tokenizer.eog_ids) or [Source.eos_token_id]
    lt = ll.LLTokenizer(ll.TokenizerWrapper(Source()), n_vocab=tokenizer.n_vocab, eos_token=eog)
    _VOCABS[tokenizer] = [lt, pieces, None]
    return lt


def token_index(tokenizer):
    """The tokens' texts as llguidance sees them, indexed for a guard (built once per tokenizer)."""
    lltokenizer(tokenizer)
    cached = _VOCABS[tokenizer]
    if cached[2] is None:
        from .tool_calls.argument_guard import TokenIndex

        cached[2] = TokenIndex(cached[1])
    return cached[2]


class _Guarded(str):
    guard = None


def guarded(lark: str, guard) -> str:
    """Lark text with a guard: the state its grammar cannot hold, kept beside the matcher (a
    tool_calls.argument_guard.ArgumentGuard: start(), feed(state, bytes) -> state or None,
    refused(state, index, allowed) -> the tokens it takes out of a mask). Grammar.from_lark
    keeps it; text made from this text does not (pass it on with guarded())."""
    out = _Guarded(lark)
    out.guard = guard
    return out


# ---------------------------------------------------------------------------------------------


class Grammar:
    """A compiled constraint, shareable by any number of sequences. Build with a from_* method;
    each raises GrammarError naming what is wrong with the schema, grammar or regex."""

    def __init__(self, llg_grammar: str, kind: str, schema: dict | None = None, guard=None):
        self._grammar = llg_grammar
        self.guard = guard  # (see guarded())
        self.kind = kind  # "json_schema" | "gbnf" | "lark" | "regex"
        self.schema = schema  # the JSON schema, for kind "json_schema"
        err = _llguidance().LLMatcher.validate_grammar(llg_grammar)
        if err and not err.startswith("WARNING"):
            raise GrammarError(f"invalid {_KIND_NAMES[kind]}: {_one_line(err)}")

    @classmethod
    def from_json_schema(cls, schema: dict | str | bool) -> Grammar:
        """JSON following `schema` (a dict, or its JSON text), laid out as json.dumps does."""
        ll = _llguidance()
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise GrammarError(f"invalid JSON schema: not JSON ({e})") from None
        if not isinstance(schema, (dict, bool)):
            raise GrammarError(f"invalid JSON schema: expected an object, got {type(schema).__name__}")
        if schema is True:  # the schema every JSON value follows
            schema = {}
        try:
            g = ll.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OPTIONS)
        except (ValueError, TypeError) as e:
            raise GrammarError(f"invalid JSON schema: {e}") from None
        return cls(g, "json_schema", schema)

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
        return cls.from_json_schema({"type": "object"})

    @classmethod
    def from_gbnf(cls, text: str) -> Grammar:
        """A llama.cpp GBNF grammar (root rule `root`), with llama.cpp's meaning (see gbnf.py)."""
        from .gbnf import gbnf_to_lark

        if not isinstance(text, str) or not text.strip():
            raise GrammarError("invalid grammar: expected GBNF text")
        return cls(_llguidance().LLMatcher.grammar_from_lark(gbnf_to_lark(text)), "gbnf")

    @classmethod
    def from_lark(cls, text: str) -> Grammar:
        """A grammar in llguidance's Lark syntax (start rule `start`)."""
        return cls(_llguidance().LLMatcher.grammar_from_lark(text), "lark", guard=getattr(text, "guard", None))

    @classmethod
    def from_regex(cls, pattern: str) -> Grammar:
        """Text matching `pattern` as a whole (Rust regex syntax)."""
        if not isinstance(pattern, str):
            raise GrammarError(f"invalid regex: expected a string, got {type(pattern).__name__}")
        return cls(_llguidance().LLMatcher.grammar_from_regex(pattern), "regex")

    @classmethod
    def from_options(cls, *, json_schema=None, grammar=None, regex=None) -> Grammar | None:
        """The one constraint given by generate()'s keywords, or None. `grammar` is GBNF text or a
        Grammar."""
        given = [k for k, v in (("json_schema", json_schema), ("grammar", grammar), ("regex", regex)) if v is not None]
        if len(given) > 1:
            raise GrammarError(f"give one constraint, not {' and '.join(given)}")
        if json_schema is not None:
            return cls.from_json_schema(json_schema)
        if regex is not None:
            return cls.from_regex(regex)
        if isinstance(grammar, Grammar):
            return grammar
        if grammar is not None:
            return cls.from_gbnf(grammar)
        return None

    @classmethod
    def from_response_format(cls, response_format: dict | None) -> Grammar | None:
        """OpenAI's response_format: {"type": "text"} (None), {"type": "json_object"} (any object;
        llama.cpp also reads a "schema" there), {"type": "json_schema", "json_schema": {"schema":
        {...}, "name": ..., "strict": ...}}."""
        if response_format is None:
            return None
        if not isinstance(response_format, dict):
            raise GrammarError(f"response_format must be an object, got {type(response_format).__name__}")
        kind = response_format.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            schema = response_format.get("schema")
            return cls.json_object() if schema is None else cls.from_json_schema(schema)
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, dict):
                raise GrammarError('response_format {"type": "json_schema"} needs a "json_schema" object')
            schema = spec.get("schema", True)  # OpenAI: "schema" may be left out (any JSON)
            return cls.from_json_schema(schema)
        raise GrammarError(f'response_format type must be "text", "json_object" or "json_schema", got {kind!r}')

    def constraint(self, tokenizer) -> Constraint:
        return Constraint(self, tokenizer)

    def __repr__(self) -> str:
        return f"Grammar({self.kind})"


class Constraint:
    """One sequence's position in a grammar. compute_mask may run in another thread, but not at
    the same time as another call on the same constraint."""

    def __init__(self, grammar: Grammar, tokenizer):
        ll = _llguidance()
        self.grammar = grammar
        self.n_vocab = tokenizer.n_vocab
        self._m = ll.LLMatcher(lltokenizer(tokenizer), grammar._grammar, log_level=0)
        self._check()
        self._guard = grammar.guard
        if self._guard is not None:  # its state after each token accepted (the first: before any)
            self._index = token_index(tokenizer)
            self._states = [self._guard.start()]
            self._peek = (None, None, None)

    def _check(self):
        if self._m.is_error():
            raise GrammarError(f"{_KIND_NAMES[self.grammar.kind]}: {_one_line(self._m.get_error())}")

    def _guarded(self, state, token: int):
        """The guard's state after token, or None where it refuses it (the last answer kept:
        accept() follows allows())."""
        if self._peek[:2] == (state, token):
            return self._peek[2]
        after = self._guard.feed(state, self._index.pieces[token])
        self._peek = (state, token, after)
        return after

    def compute_mask(self, out: np.ndarray | None = None) -> np.ndarray:
        """Bitmask of the tokens allowed next: int32 [ceil(n_vocab / 32)], bit t % 32 of word
        t // 32 for token t. Releases the GIL while it works (a guard's part aside)."""
        if out is None:
            out = np.empty((self.n_vocab + 31) // 32, dtype=np.int32)
        self._m.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        self._check()
        if self._guard is not None:
            words = out.view(np.uint32)
            for ids in self._guard.refused(self._states[-1], self._index, words):
                ids = np.asarray(ids, dtype=np.int64)
                if ids.size:
                    np.bitwise_and.at(words, ids >> 5, ~(np.uint32(1) << (ids & 31).astype(np.uint32)))
        return out

    def allows(self, token: int) -> bool:
        """Whether `token` may come next (one token's check: far cheaper than the mask)."""
        if self._m.validate_tokens([int(token)]) != 1:
            return False
        return self._guard is None or self._guarded(self._states[-1], int(token)) is not None

    def accept(self, token: int) -> None:
        if self._guard is not None:
            state = self._guarded(self._states[-1], int(token))
            if state is None:
                raise GrammarError(f"token {token} is not allowed here: it repeats an argument or leaves out a required one")
        if not self._m.consume_token(int(token)):
            raise GrammarError(f"token {token} is not allowed here: {_one_line(self._m.get_error())}")
        if self._guard is not None:
            self._states.append(state)

    def _guard_prefix(self, tokens: Sequence[int]) -> int:
        """How many of tokens, from the first, the guard allows in a row from here."""
        state = self._states[-1]
        for i, t in enumerate(tokens):
            state = self._guarded(state, int(t))
            if state is None:
                return i
        return len(tokens)

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of tokens, from the first, the grammar allows in a row from here (speculative
        decoding cuts its drafts there)."""
        n = self._m.validate_tokens([int(t) for t in tokens]) if len(tokens) else 0
        return n if self._guard is None else self._guard_prefix(tokens[:n])

    def rollback(self, n: int) -> None:
        """Undo the last n accepted tokens."""
        if n and not self._m.rollback(int(n)):
            raise GrammarError(f"could not undo {n} tokens: {_one_line(self._m.get_error())}")
        if n and self._guard is not None:
            del self._states[-n:]

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar admits as the only continuation from here (not yet accepted)."""
        forced = self._m.compute_ff_tokens()
        return forced if self._guard is None else forced[:self._guard_prefix(forced)]

    @property
    def accepting(self) -> bool:
        """The text so far is complete: the grammar allows ending here."""
        return self._m.is_accepting()

    @property
    def finished(self) -> bool:
        """Nothing may follow but the end."""
        return self._m.is_stopped()


def allowed(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask[token >> 5]) >> (token & 31)) & 1)


def masked_logits(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A copy of logits with the tokens the mask forbids at -inf."""
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little", count=logits.shape[0]).view(bool)
    return np.where(bits, logits, np.float32(-np.inf))


# ---------------------------------------------------------------------------------------------
# one constraint in a generation loop


class Guide:
    """Sampling under a constraint, for one sequence in a generation loop:

        tok = guide.sample(sampler, logits, history)    # a token the grammar allows
        new = guide.advance(tok, budget)                 # tok + the tokens the grammar forces
        logits = session.feed(new)                       # evaluated as one batch

    Sampling follows llama.cpp's common sampler: draw from the unconstrained logits and keep the
    token if the grammar allows it (a check of that one token, ~2 us); only when it does not are
    the forbidden tokens removed from the logits (the full mask, ~10-50 us on 50k-262k tokens)
    and a token drawn again. The grammar costs well under 5% of a decode step, so it runs inline:
    a worker thread would compete with the engine's threads for the cores."""

    def __init__(self, constraint: Constraint, *, jump_forward: bool = True):
        self.constraint = constraint
        self.jump_forward = jump_forward
        self._mask = np.empty((constraint.n_vocab + 31) // 32, dtype=np.int32)
        self.forced = 0  # tokens appended without sampling
        self.masked = 0  # draws the grammar rejected, redrawn from the masked logits

    def sample(self, sampler, logits: np.ndarray, history: Sequence[int]) -> int:
        tok = sampler.sample(logits, history)
        if self.constraint.allows(tok):
            return tok
        mask = self.constraint.compute_mask(self._mask)
        if not mask.any():
            raise GrammarError("the constraint allows no token here")
        self.masked += 1
        return sampler.sample(masked_logits(logits, mask), history)

    def distribution(self, sampler, logits: np.ndarray, history: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """What sample() draws from (temperature > 0), as (token ids, probabilities): a token of
        the unconstrained draw when the grammar allows it, else one of the masked draw, so
        p(t) = p_free(t) + (1 - S) * p_masked(t) for allowed t, S the free mass allowed.
        (Speculative decoding's acceptance rule needs it.)"""
        c = sampler.candidates(logits, history)
        p = probabilities(c)
        mask = self.constraint.compute_mask(self._mask)
        ok = np.unpackbits(mask.view(np.uint8), bitorder="little", count=self.constraint.n_vocab).view(bool)[c.ids]
        s = float(p[ok].sum())
        if s >= 1.0:
            return c.ids, p
        if not mask.any():
            raise GrammarError("the constraint allows no token here")
        m = sampler.candidates(masked_logits(logits, mask), history)
        full = np.zeros(self.constraint.n_vocab, dtype=np.float64)
        full[c.ids[ok]] = p[ok]
        full[m.ids] += (1.0 - s) * probabilities(m)
        ids = np.flatnonzero(full)
        return ids, full[ids]

    def advance(self, token: int, budget: int | None = None) -> list[int]:
        """Accept `token`, then up to budget - 1 forced tokens; returns them all."""
        c = self.constraint
        c.accept(token)
        out = [token]
        if self.jump_forward and not c.finished and (budget is None or budget > 1):
            forced = c.forced_tokens()
            if budget is not None:
                forced = forced[: budget - 1]
            for t in forced:
                c.accept(t)
            out += forced
            self.forced += len(forced)
        return out
