"""Constrained generation (edgellm.constrain through llguidance): JSON schemas validated with
jsonschema on both real models, llama.cpp's own GBNF grammars checked with llguidance's matcher,
forced tokens, truncation reported as such, and bad schemas / grammars / regexes as clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal

import jsonschema
import numpy as np
import pytest

from edgellm.constrain import Grammar, allowed, masked_logits
from edgellm.errors import GrammarError
from llamacpp_source import grammars_dir

CMD = [sys.executable, "-m", "edgellm"]


def _str(n=16, **kw):
    return {"type": "string", "maxLength": n, **kw}


# Ten schemas with the features the issue names; strings and arrays are bounded so that every
# generation ends inside a modest max_tokens.
SCHEMAS = {
    "nested_objects": {
        "type": "object",
        "properties": {
            "person": {"type": "object", "properties": {"name": _str(), "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                       "required": ["name", "age"], "additionalProperties": False},
            "active": {"type": "boolean"},
        },
        "required": ["person", "active"], "additionalProperties": False,
    },
    "array_bounds": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": _str(10), "minItems": 2, "maxItems": 4}},
        "required": ["tags"], "additionalProperties": False,
    },
    "enums": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"type": "string", "enum": ["S", "M", "L"]}},
        "required": ["color", "size"], "additionalProperties": False,
    },
    "number_ranges": {
        "type": "object",
        "properties": {"temperature": {"type": "number", "minimum": -50, "maximum": 60},
                       "humidity": {"type": "integer", "minimum": 0, "maximum": 100},
                       # digits bounded by multipleOf: a small model may write 0.9059752478624674515999...
                       "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1, "multipleOf": 0.001}},
        "required": ["temperature", "humidity", "ratio"], "additionalProperties": False,
    },
    "optional_keys": {
        "type": "object",
        "properties": {"title": _str(24), "subtitle": _str(24), "pages": {"type": "integer", "minimum": 1, "maximum": 999}},
        "required": ["title"], "additionalProperties": False,
    },
    "string_patterns": {
        "type": "object",
        "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                       "phone": {"type": "string", "pattern": "^\\+?[0-9]{3}-[0-9]{4}$"},
                       "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}},
        "required": ["zip", "phone", "code"], "additionalProperties": False,
    },
    "array_of_objects": {
        "type": "object",
        "properties": {"items": {"type": "array", "maxItems": 3, "minItems": 1, "items": {
            "type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
                                             "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["sku", "qty"], "additionalProperties": False}}},
        "required": ["items"], "additionalProperties": False,
    },
    "top_level_array": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 6}, "minItems": 3, "maxItems": 3},
    "anyof_const_null": {
        "type": "object",
        "properties": {"status": {"anyOf": [{"type": "null"}, {"const": "ok"}, {"type": "integer", "minimum": 400, "maximum": 599}]},
                       "retry": {"type": "boolean"}},
        "required": ["status", "retry"], "additionalProperties": False,
    },
    "defs_and_refs": {
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -99, "maximum": 99},
                                                              "y": {"type": "integer", "minimum": -99, "maximum": 99}},
                            "required": ["x", "y"], "additionalProperties": False}},
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"], "additionalProperties": False,
    },
}
N_SAMPLES = 20


def validate(text: str, schema: dict) -> None:
    """jsonschema.validate on the reply, numbers read as decimals in both (JSON numbers are
    decimal: with floats, 0.473 is "not a multiple of 0.001", as 0.473 / 0.001 is 472.99999999999994)."""
    jsonschema.validate(json.loads(text, parse_float=Decimal), json.loads(json.dumps(schema), parse_float=Decimal))


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "gemma3-270m"])
def real_llm(request):
    import edgellm

    return edgellm.LLM(request.param, n_ctx=512)


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    import edgellm

    return edgellm.LLM(smollm2_path, n_ctx=512)


# --------------------------------------------------------------------------------------------
# acceptance: schemas on both real models, llama.cpp's grammars


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_sampled_json_validates_against_the_schema(real_llm, name):
    """20 sampled replies, decoded together (chat_batch; each is the text it would be alone), as
    OpenAI's response_format: each parses and validates (a reply cut at max_tokens would not)."""
    schema = SCHEMAS[name]
    messages = [{"role": "user", "content": f"Reply with JSON for this schema: {json.dumps(schema)}"}]
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    outs = real_llm.chat_batch([messages] * N_SAMPLES, response_format=fmt, max_tokens=160,
                               seed=list(range(N_SAMPLES)), temperature=1.0)
    for seed, out in enumerate(outs):
        validate(out, schema)
    assert len(set(outs)) > 1  # the seeds drew different replies


GRAMMAR_PROMPTS = {
    "arithmetic": "Write two lines of arithmetic, like: x = 3 + 4",
    "c": "Repeat this C code exactly: int main(){return 0;}",
    "chess": "Write the first moves of a chess game in PGN notation.",
    "english": "Say hello in one short sentence.",
    "japanese": "Say hello in Japanese.",
    "json": "Give a short JSON object with a cat's name and age.",
    "json_arr": "Give a JSON array of two colors.",
    "list": "List three fruits as a bullet list.",
}
MIN_TOKENS = 8  # read at least this much of a generation before taking an accepted prefix
MAX_SEEDS = 10


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(GRAMMAR_PROMPTS))
def test_llamacpp_gbnf_grammars_constrain_generation(smollm2, name):
    """Each of llama.cpp's grammars/*.gbnf loads and constrains 5 sampled generations that its
    grammar accepts. Most of them repeat without end (`item+`), so the stream is read until the
    model ends it or, past MIN_TOKENS pieces, the text is a complete sentence of the grammar;
    the text is checked with llguidance's matcher fed its bytes. A small model may loop until
    max_tokens (a name that never ends): such a text must still be a valid prefix, and another
    seed is tried, up to MAX_SEEDS."""
    path = grammars_dir() / f"{name}.gbnf"
    grammar = Grammar.from_gbnf(path.read_text(encoding="utf-8"))
    check = llguidance_matcher(grammar, with_prefix=True)
    messages = [{"role": "user", "content": GRAMMAR_PROMPTS[name]}]
    complete = []
    for seed in range(MAX_SEEDS):
        text, n = "", 0
        stream = smollm2.chat(messages, grammar=grammar, max_tokens=120, seed=seed, stream=True)
        for piece in stream:
            text += piece
            n += 1
            if n >= MIN_TOKENS and check(text) == (True, True):
                stream.close()
                break
        valid_prefix, accepted = check(text)
        assert text.strip() and valid_prefix, (name, seed, text)
        if accepted:
            complete.append(text)
        if len(complete) == 5:
            break
    assert len(complete) == 5, (name, complete)


# --------------------------------------------------------------------------------------------
# the constraint object and the generation hook


@pytest.mark.real
def test_constraint_masks_forces_and_finishes(smollm2):
    tok = smollm2.tokenizer
    g = Grammar.from_json_schema({"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
                                  "required": ["name", "n"], "additionalProperties": False})
    c = g.constraint(tok)
    forced = c.forced_tokens()
    assert tok.decode(forced).startswith('{"name"')  # the key is the only way to start
    mask = c.compute_mask()
    assert allowed(mask, forced[0]) and not allowed(mask, tok.encode("[", add_bos=False)[0])
    for t in forced:
        c.accept(t)
    with pytest.raises(GrammarError, match="not allowed"):
        c.accept(tok.encode("}", add_bos=False)[0])
    c = g.constraint(tok)
    for t in tok.encode('{"name": "Al", "n": 7}', add_bos=False):
        assert not c.finished
        c.accept(t)
    assert c.accepting and c.finished
    logits = np.zeros(tok.n_vocab, dtype=np.float32)
    m = c.compute_mask()
    out = masked_logits(logits, m)
    assert all(np.isfinite(out[i]) == allowed(m, i) for i in range(0, tok.n_vocab, 97))
    assert np.isfinite(out).sum() == sum(tok.is_eog(i) for i in range(tok.n_vocab))  # only the end remains


@pytest.mark.real
def test_forced_tokens_are_appended_in_one_batch(smollm2):
    schema = {"type": "object", "properties": {"first_name": _str(12), "last_name": _str(12), "year_of_birth": {"type": "integer"}},
              "required": ["first_name", "last_name", "year_of_birth"], "additionalProperties": False}
    out = smollm2.chat([{"role": "user", "content": "A famous scientist as JSON."}], json_schema=schema, temperature=0,
                       max_tokens=80)
    s = smollm2.last_stats
    assert list(json.loads(out)) == ["first_name", "last_name", "year_of_birth"]
    assert s.forced_tokens >= 6  # '{"first_name": "', '", "last_name": "', '", "year_of_birth": '
    assert s.stop_reason == "grammar"


@pytest.mark.real
def test_greedy_constrained_output_is_the_best_allowed_token_each_step(smollm2):
    """temperature 0 under a regex: each generated token is the argmax of the masked logits."""
    llm = smollm2
    g = Grammar.from_regex(r"[0-9]{2}:[0-9]{2}")
    prompt = llm.tokenize("The train leaves at ")
    out = llm.generate(prompt, grammar=g, temperature=0, max_tokens=10)
    c, s = g.constraint(llm.tokenizer), llm.session()
    logits, ids = s.feed(prompt), llm.tokenize(out, add_bos=False)
    for t in ids:
        forced = c.forced_tokens()
        if forced and forced[0] == t:
            c.accept(t)
            logits = s.feed([t])
            continue
        assert int(np.argmax(masked_logits(logits, c.compute_mask()))) == t
        c.accept(t)
        logits = s.feed([t])
    assert c.finished


@pytest.mark.real
def test_generate_batch_follows_the_constraint(smollm2):
    schema = SCHEMAS["enums"]
    prompts = [smollm2.chat_tokens(smollm2.template.render([{"role": "user", "content": f"A {w} shirt as JSON."}]))
               for w in ("red", "small", "large blue")]
    outs = smollm2.generate_batch(prompts, json_schema=schema, max_tokens=40, seed=[1, 2, 3])
    for out in outs:
        validate(out, schema)
    cut = smollm2.generate_batch(prompts[:2], json_schema=SCHEMAS["array_bounds"], max_tokens=3)
    assert all(len(smollm2.tokenize(c, add_bos=False)) <= 4 for c in cut)


@pytest.mark.real
def test_max_tokens_inside_an_object_is_reported_as_length(smollm2):
    out = smollm2.generate("A list: ", json_schema={"type": "array", "items": {"type": "string"}, "minItems": 50},
                           max_tokens=6, seed=0)
    assert smollm2.last_stats.stop_reason == "length" and smollm2.last_stats.generated_tokens == 6
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)


@pytest.mark.real
def test_response_format(smollm2):
    msgs = [{"role": "user", "content": "Describe a dog."}]
    out = smollm2.chat(msgs, response_format={"type": "json_object"}, max_tokens=120, seed=1)
    assert isinstance(json.loads(out), dict) or smollm2.last_stats.stop_reason == "length"
    schema = {"type": "object", "properties": {"breed": _str(20)}, "required": ["breed"], "additionalProperties": False}
    out = smollm2.chat(msgs, response_format={"type": "json_schema", "json_schema": {"name": "dog", "schema": schema}},
                       max_tokens=60, seed=1)
    validate(out, schema)
    assert smollm2.chat(msgs, response_format={"type": "text"}, max_tokens=3, seed=1)
    with pytest.raises(GrammarError, match="response_format type"):
        smollm2.chat(msgs, response_format={"type": "yaml"})
    with pytest.raises(GrammarError, match="not several"):
        smollm2.chat(msgs, response_format={"type": "json_object"}, grammar='root ::= "x"')
    with pytest.raises(GrammarError, match="response_format, json_schema, grammar, regex"):
        smollm2.chat_batch([msgs], response_format={"type": "json_object"}, regex="a+")


# --------------------------------------------------------------------------------------------
# bad input


# --------------------------------------------------------------------------------------------
# a tokenizer that puts a space in front of text (SPM's add_space_prefix, as the tiny llama's)


@pytest.fixture(scope="module")
def tiny_spm(tmp_path_factory):
    import edgellm
    from tiny_models import tiny_model

    llm = edgellm.LLM(str(tiny_model(tmp_path_factory.mktemp("spm") / "tiny-llama.gguf", "llama")), n_ctx=128,
                      n_threads=1)
    assert llm.tokenizer.vocab.add_space_prefix
    return llm


def _mask_ids(c) -> np.ndarray:
    bits = np.unpackbits(c.compute_mask().view(np.uint8), bitorder="little", count=c.n_vocab)
    return np.flatnonzero(bits)


def test_forced_text_and_the_mask_agree_with_the_grammar_on_a_space_prefix_tokenizer(tiny_spm):
    """llguidance tokenizes the text a grammar forces with our tokenizer: with SPM's space put in
    front, JSON's forced '{' became the tokens ' ', '{', the mask allowed only ' ' and the grammar
    then refused it (fuzz http inputs 122 and 737: a 500, and a stream cut by an internal error).
    Every token the mask allows must be one the grammar takes."""
    tok = tiny_spm.tokenizer
    c = Grammar.json_object().constraint(tok)
    assert b"".join(tok.token_bytes(t) for t in c.forced_tokens()) == b"{"
    (a,) = tok.encode("a", add_bos=False, space_prefix=False)
    with pytest.raises(GrammarError) as e:
        Grammar.json_object().constraint(tok).accept(a)
    # one line naming the problem, without the matcher's dump of its state and the grammar
    assert str(e.value).startswith(f"token {a} is not allowed here: ") and "<state>" not in str(e.value), e.value
    for t in tok.encode('{"a": [1, "b"]}', add_bos=False, space_prefix=False):
        ids = _mask_ids(c)
        assert ids.size and all(c.allows(int(i)) for i in ids), [int(i) for i in ids if not c.allows(int(i))]
        assert t in ids
        c.accept(t)
    assert c.accepting


def test_a_biased_forbidden_token_is_never_chosen(tiny_spm):
    """Biases come before the grammar, as in llama.cpp: a token the grammar forbids, raised by
    +100 (the most logit_bias allows), is never chosen, greedy or sampled: by a Guide, by
    BatchEngine requests with and without prompt lookup, and generate() keeps to the grammar."""
    from edgellm.constrain import Guide
    from edgellm.sampling import Sampler, SamplingParams
    from edgellm.scheduler import BatchEngine

    llm, tok, g = tiny_spm, tiny_spm.tokenizer, Grammar.json_object()
    space = next(t for t in range(tok.n_vocab) if tok.token_bytes(t) == b" ")
    assert not g.constraint(tok).allows(space)
    prompt = llm.tokenize("hi")
    settings = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=0, min_p=0, seed=3)]
    for params in settings:
        guide = Guide(g.constraint(tok))
        logits = np.zeros(tok.n_vocab, dtype=np.float32)
        logits[space] = 100
        chosen = guide.sample(Sampler(params, tok.n_vocab), logits, prompt)
        assert chosen != space
        guide.advance(chosen)
    eng = BatchEngine(llm, max_seqs=4)
    reqs = [eng.submit(prompt, max_tokens=12, sampling=p, logit_bias={space: 100.0}, grammar=g, speculative=spec)
            for p in settings for spec in (None, "lookup")]
    eng.run_until_done(reqs)
    for r in reqs:
        assert r.error is None and r.finish_reason in ("stop", "length"), r.error
        c = g.constraint(tok)
        for t in r.generated:
            c.accept(t)  # raises when the grammar forbids t
    check = llguidance_matcher(g, with_prefix=True)
    for spec in (None, "lookup"):
        out = llm.generate(prompt, json_schema={"type": "object"}, temperature=0, max_tokens=12, speculative=spec)
        assert out.startswith("{") and check(out)[0], out


@pytest.mark.parametrize("make, match", [
    (lambda: Grammar.from_json_schema({"type": "strin"}), "invalid JSON schema: .*strin"),
    (lambda: Grammar.from_json_schema('{"type": '), "invalid JSON schema: not JSON"),
    (lambda: Grammar.from_json_schema([1]), "expected an object"),
    (lambda: Grammar.from_json_schema({"type": "string", "pattern": "(("}), "invalid JSON schema: .*unclosed group"),
    (lambda: Grammar.from_json_schema({"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}), "nope"),
    (lambda: Grammar.from_json_schema({"type": "integer", "minimum": "x"}), "minimum"),
    (lambda: Grammar.from_gbnf('root ::= "a" | b'), "invalid grammar: undefined rule 'b' at line 1, column 16"),
    (lambda: Grammar.from_gbnf("root ::= [a-"), "invalid grammar: .*end of grammar"),
    (lambda: Grammar.from_gbnf('item ::= "x"'), "no root rule"),
    (lambda: Grammar.from_gbnf('root ::= "x"\nroot ::= "y"'), "defined twice at line 2"),
    (lambda: Grammar.from_gbnf('root ::= "x" )'), "unexpected character at line 1, column 14"),
    (lambda: Grammar.from_gbnf('root ::= "\\q"'), r"unknown escape \\q"),
    (lambda: Grammar.from_gbnf('root ::= [z-a]'), "range out of order"),
    (lambda: Grammar.from_gbnf('root ::= "a"{3,1}'), "n < m"),
    (lambda: Grammar.from_gbnf('root ::= "abc'), "unterminated literal"),
    (lambda: Grammar.from_gbnf(""), "expected GBNF text"),
    (lambda: Grammar.from_regex("("), "invalid regex: .*unclosed group"),
    (lambda: Grammar.from_regex("a{2,1}"), "invalid regex"),
    (lambda: Grammar.from_options(json_schema={}, regex="x"), "not json_schema and regex"),
    (lambda: Grammar.from_response_format({"type": "json_schema"}), "needs a \"json_schema\" object"),
])
def test_bad_constraints_are_clear_errors(make, match):
    with pytest.raises(GrammarError, match=match) as e:
        make()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("gbnf, good, bad", [
    # llama.cpp matches characters with no lexer: the newline ends the line although ws could take it
    ('root ::= num "\\n"\nnum ::= [0-9]+ ws\nws ::= [ \\t\\n]*', ["12\n", "12 \n\n"], ["12", "12 x\n"]),
    ('root ::= ("a" | "bc"){2,3} "!"?', ["aa", "abc!", "bcbcbc"], ["a", "aaaa", "b"]),
    ('root ::= [^"\\x00-\\x1F] "\\u00e9" "\\x41" [\\]\\[-]', ["xéA]", "yéA-"], ['"éA]', "xeA]"]),
    ('root ::= . "|" .   # any character\n', ["a|\n", "é|x"], ["ab|c"]),
    ('root ::=\n  "x" ( "y"\n   | "z" ) # comment\n\n', ["xy", "xz"], ["x"]),
    ('root ::= word-list\nword-list ::= | camelCase " " word-list\ncamelCase ::= "w"', ["", "w w "], ["w"]),
])
def test_gbnf_means_what_it_means_to_llamacpp(gbnf, good, bad):
    from edgellm.gbnf import gbnf_to_lark

    grammar = Grammar.from_gbnf(gbnf)
    lark = gbnf_to_lark(gbnf)
    m = llguidance_matcher(grammar)
    for text in good:
        assert m(text), (text, lark)
    for text in bad:
        assert not m(text), (text, lark)


def llguidance_matcher(grammar, with_prefix: bool = False):
    """Whether llguidance accepts a text under `grammar`, byte by byte (no model tokenizer), and
    its guard (constrain.guarded) if it has one; with with_prefix, (whether the text is a valid
    prefix, whether it is accepted)."""
    import llguidance

    tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()))

    def check(text: str):
        m = llguidance.LLMatcher(tok, grammar._grammar, log_level=0)
        prefix = m.consume_tokens(list(text.encode()))
        if grammar.guard is not None:
            prefix = prefix and grammar.guard.feed(grammar.guard.start(), text.encode()) is not None
        accepted = prefix and m.is_accepting()
        return (prefix, accepted) if with_prefix else accepted

    return check


class _ByteTokenizer:
    """256 byte tokens and an end token: enough for llguidance to match any text."""
    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([b]) for b in range(256)] + [b"\xff<end>"]
    special_token_ids = [256]

    def __call__(self, text):
        return list(text.encode() if isinstance(text, str) else text)


@pytest.mark.real
def test_cli_constraints_and_their_errors(smollm2_path, tmp_path):
    schema = '{"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}'
    r = subprocess.run(CMD + ["generate", str(smollm2_path), "-p", "Two numbers: ", "--json-schema", schema, "-n", "30",
                              "--seed", "1", "-t", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)) == 2
    g = tmp_path / "yes.gbnf"
    g.write_text('root ::= ("yes" | "no") "!"\n')
    r = subprocess.run(CMD + ["generate", str(smollm2_path), "-p", "Answer: ", "--grammar-file", str(g), "-n", "10",
                              "-t", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout in ("yes!\n", "no!\n"), r
    bad = tmp_path / "bad.gbnf"
    bad.write_text("root ::= (")
    for args, match in ((["--grammar-file", str(bad)], "invalid grammar"), (["--json-schema", "{"], "not JSON"),
                        (["--regex", "(("], "invalid regex"), (["--grammar-file", str(tmp_path / "none")], "does not exist"),
                        (["--json-schema", "{}", "--regex", "a"], "give one constraint")):
        r = subprocess.run(CMD + ["generate", str(smollm2_path), "-p", "x"] + args, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode != 0 and match in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = subprocess.run(CMD + ["generate", str(smollm2_path), "-p", "Digits: ", "--regex", "[0-9]{40}", "-n", "4", "-t", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "cut at 4 tokens" in r.stderr and len(r.stderr.strip().splitlines()) == 1
