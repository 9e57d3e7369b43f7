"""Chat templates: the real models' templates (read with gguf-py), the built-in fallbacks, the
sandbox, transformers-compatible helpers, and message validation."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from conftest import gguf_py_of_real_model
from edgellm.chat import CHATML_TEMPLATE, ChatTemplate
from edgellm.errors import TemplateError, TokenizerError

KEYS = (
    "general.architecture",
    "tokenizer.chat_template",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
)

CHAT = [
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "Tell me a joke."},
]
SYSTEM = {"role": "system", "content": "You are terse."}


def read_meta(path, with_tokens: bool):
    """A real model's GGUF metadata as plain values, read by gguf-py; plus a token-text lookup."""
    reader = gguf_py_of_real_model(path)
    meta = {k: reader.fields[k].contents() for k in KEYS if k in reader.fields}
    tokens = reader.fields["tokenizer.ggml.tokens"]
    if with_tokens:
        meta["tokenizer.ggml.tokens"] = tokens.contents()
    return meta, tokens.contents


@pytest.fixture(scope="module")
def smollm2_meta(smollm2_path):
    return read_meta(smollm2_path, with_tokens=True)[0]


@pytest.fixture(scope="module")
def gemma3_meta(gemma3_path):
    return read_meta(gemma3_path, with_tokens=False)


# --------------------------------------------------------------------------------------------
# the real models


@pytest.mark.real
def test_smollm2_template_from_gguf(smollm2_meta):
    t = ChatTemplate.from_metadata(smollm2_meta)
    assert not t.is_builtin and t.source == smollm2_meta["tokenizer.chat_template"]
    assert (t.bos_token, t.eos_token, t.arch) == ("<|im_start|>", "<|im_end|>", "llama")
    assert t.stop_strings == ["<|im_end|>"]
    # no system message: the template adds SmolLM's default one
    assert t.render(CHAT) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHello!<|im_end|>\n"
        "<|im_start|>assistant\nHi! How can I help?<|im_end|>\n"
        "<|im_start|>user\nTell me a joke.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert t.render([SYSTEM] + CHAT, add_generation_prompt=False) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHello!<|im_end|>\n"
        "<|im_start|>assistant\nHi! How can I help?<|im_end|>\n"
        "<|im_start|>user\nTell me a joke.<|im_end|>\n"
    )


@pytest.mark.real
@pytest.mark.slow  # gguf-py reads all 262144 tokens of the file's metadata (~10 s)
def test_gemma3_gguf_has_no_template_so_the_gemma_fallback_is_used(gemma3_meta):
    meta, token_text = gemma3_meta
    assert "tokenizer.chat_template" not in meta  # this GGUF carries none
    t = ChatTemplate.from_metadata(meta, token_text)
    assert t.is_builtin and t.arch == "gemma3"
    assert (t.bos_token, t.eos_token, t.add_bos) == ("<bos>", "<eos>", True)
    assert t.stop_strings == ["<end_of_turn>", "<eos>"]
    assert t.render(CHAT) == (
        "<start_of_turn>user\nHello!<end_of_turn>\n"
        "<start_of_turn>model\nHi! How can I help?<end_of_turn>\n"
        "<start_of_turn>user\nTell me a joke.<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    # Gemma has no system turn: it opens the first user turn, then a blank line
    assert t.render([SYSTEM] + CHAT, add_generation_prompt=False) == (
        "<start_of_turn>user\nYou are terse.\n\nHello!<end_of_turn>\n"
        "<start_of_turn>model\nHi! How can I help?<end_of_turn>\n"
        "<start_of_turn>user\nTell me a joke.<end_of_turn>\n"
    )


# --------------------------------------------------------------------------------------------
# fallbacks and metadata


def test_chatml_fallback_for_other_architectures():
    t = ChatTemplate(None, arch="llama", eos_token="<|im_end|>")
    assert t.is_builtin and t.stop_strings == ["<|im_end|>"]
    assert t.render([SYSTEM, CHAT[0]]) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ChatTemplate("", arch=None).source == ChatTemplate(None).source


def test_gemma_fallback_trims_and_keeps_system_for_the_next_user_turn():
    t = ChatTemplate(None, arch="gemma")
    msgs = [{"role": "user", "content": "  hi \n"}, {"role": "system", "content": " later system "}, CHAT[1], CHAT[2]]
    assert t.render(msgs, add_generation_prompt=False) == (
        "<start_of_turn>user\nhi<end_of_turn>\n"
        "<start_of_turn>model\nHi! How can I help?<end_of_turn>\n"
        "<start_of_turn>user\nlater system\n\nTell me a joke.<end_of_turn>\n"
    )


def test_bos_written_by_template_is_dropped_when_tokenizer_adds_one():
    src = "{{ bos_token }}{% for m in messages %}[{{ m['content'] }}]{% endfor %}{{ eos_token }}"
    kw = dict(bos_token="<s>", eos_token="</s>")
    assert ChatTemplate(src, **kw).render(CHAT[:1]) == "<s>[Hello!]</s>"
    assert ChatTemplate(src, add_bos=True, **kw).render(CHAT[:1]) == "[Hello!]</s>"
    assert ChatTemplate(src, add_bos=True, add_eos=True, **kw).render(CHAT[:1]) == "[Hello!]"


def test_from_metadata_lookups_and_errors():
    meta = {
        "general.architecture": "llama",
        "tokenizer.chat_template": "{{ bos_token }}|{{ eos_token }}",
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.tokens": ["<s>", "x", "</s>"],
    }
    t = ChatTemplate.from_metadata(meta)
    assert t.render(CHAT[:1]) == "<s>|</s>" and not t.add_bos
    assert ChatTemplate.from_metadata(meta, add_bos=True).render(CHAT[:1]) == "|</s>"
    assert ChatTemplate.from_metadata(meta, lambda i: f"<{i}>").render(CHAT[:1]) == "<0>|<2>"
    with pytest.raises(TokenizerError, match="eos_token_id = 7"):
        ChatTemplate.from_metadata({**meta, "tokenizer.ggml.eos_token_id": 7})
    no_tokens = {k: v for k, v in meta.items() if k != "tokenizer.ggml.tokens"}
    with pytest.raises(TokenizerError, match="tokenizer.ggml.tokens is missing"):
        ChatTemplate.from_metadata(no_tokens)
    bare = ChatTemplate.from_metadata({"general.architecture": "gemma3"})
    assert bare.is_builtin and bare.bos_token == "" and bare.stop_strings == ["<end_of_turn>"]
    # found by scripts/fuzz.py: an architecture that is not a string (the loader's error to
    # report) made a TypeError here
    for odd in (["gemma3"], 3, None):
        assert ChatTemplate.from_metadata({"general.architecture": odd}).source == CHATML_TEMPLATE


# --------------------------------------------------------------------------------------------
# environment: transformers-compatible behaviour


def test_trim_and_lstrip_blocks_as_transformers():
    src = "A\n    {% if true %}\nB\n    {% endif %}\nC"
    assert ChatTemplate(src).render(CHAT[:1]) == "A\nB\nC"


def test_tojson_like_transformers():
    t = ChatTemplate("{{ messages[0]['content'] | tojson }}|{{ {'k': [1, 2]} | tojson(indent=2) }}")
    out = t.render([{"role": "user", "content": "héllo <b> & 'q'"}])
    first, second = out.split("|", 1)
    assert first == '"héllo <b> & \'q\'"'  # non-ASCII kept, no HTML escaping
    assert second == json.dumps({"k": [1, 2]}, indent=2)


def test_raise_exception_becomes_template_error():
    t = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok")
    assert t.render(CHAT[:1]) == "ok"
    with pytest.raises(TemplateError, match="rejected the messages: first must be user"):
        t.render(CHAT[1:])


def test_strftime_now_and_loop_controls():
    year = datetime.now().year
    out = ChatTemplate("{{ strftime_now('%Y') }}").render(CHAT[:1])
    assert int(out) in (year, year + 1)  # a render straddling New Year's midnight
    loop = "{% for m in messages %}{% if loop.index0 == 1 %}{% break %}{% endif %}{{ m['role'] }};{% endfor %}"
    assert ChatTemplate(loop).render(CHAT) == "user;"
    skip = "{% for m in messages %}{% if m['role'] == 'assistant' %}{% continue %}{% endif %}{{ m['role'] }};{% endfor %}"
    assert ChatTemplate(skip).render(CHAT) == "user;user;"


def test_source_date_epoch_fixes_the_templates_date(monkeypatch):
    """SOURCE_DATE_EPOCH (seconds, UTC) is the date strftime_now and firefunction's `datetime`
    render, so a prompt that carries the date is the same on every day."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1721995200")  # 2024-07-26 12:00 UTC
    assert ChatTemplate("{{ strftime_now('%Y-%m-%d %H') }}").render(CHAT[:1]) == "2024-07-26 12"
    assert ChatTemplate("{{ datetime }}").tool_context(None) == {"datetime": "Jul 26 2024"}
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "not a number")  # ignored, as by the build tools
    assert ChatTemplate("{{ strftime_now('%Y') }}").render(CHAT[:1]) != "2024"


def test_undefined_variables_are_falsy_as_in_transformers():
    assert ChatTemplate("{% if undefined_var %}T{% else %}none{% endif %}").render(CHAT[:1]) == "none"


def test_tools_and_documents_are_defined_as_none_unless_given_as_in_transformers():
    t = ChatTemplate("{{ tools is none }}|{{ documents is none }}|{% for t in tools or [] %}{{ t.function.name }}{% endfor %}")
    assert t.render(CHAT[:1]) == "True|True|"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert t.render(CHAT[:1], tools=tools) == "False|True|f"
    assert ChatTemplate("{{ functions }}").render(CHAT[:1], functions="[spec]") == "[spec]"  # extra variables


def test_generation_tag_renders_its_body():
    t = ChatTemplate("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}[{{ m.content }}]"
                     "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}")
    assert t.render(CHAT) == "Hello![Hi! How can I help?]Tell me a joke."


def test_system_message_is_folded_into_the_next_one_where_the_template_has_no_system_role():
    no_system = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
                 "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    t = ChatTemplate(no_system)
    assert not t.supports_system_role
    assert t.render([SYSTEM] + CHAT[:1]) == "<user>You are terse.\nHello!"  # llama.cpp: system, newline, user
    ignores_system = "{% for m in messages if m.role != 'system' %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    assert ChatTemplate(ignores_system).render([SYSTEM] + CHAT[:1]) == "<user>You are terse.\nHello!"
    with pytest.raises(TemplateError, match="no system role"):
        t.render([SYSTEM])
    assert ChatTemplate(None).supports_system_role


def test_tool_call_messages_may_leave_content_out():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}
    t = ChatTemplate("{% for m in messages %}{{ m.role }}:{{ m.content }}:{{ m.tool_calls | length }};{% endfor %}")
    assert t.render([CHAT[0], {"role": "assistant", "tool_calls": [call]},
                     {"role": "assistant", "content": None, "tool_calls": [call]}]) == "user:Hello!:0;assistant::1;assistant::1;"


# --------------------------------------------------------------------------------------------
# sandbox


@pytest.mark.parametrize(
    "src",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ joiner.__init__.__globals__['os'] }}",
        "{{ namespace.__init__.__globals__ }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{{ '{0.__class__}'.format(1) }}",
        "{{ messages[0].__class__ }}",
        "{{ raise_exception.__globals__ }}",
        "{{ strftime_now.__globals__ }}",
    ],
)
def test_sandbox_blocks_python_internals(src):
    with pytest.raises(TemplateError, match="not allowed"):
        ChatTemplate(src).render(CHAT[:1])


@pytest.mark.parametrize(
    "src, match",
    [
        ("{% include '/etc/passwd' %}", "cannot include or import"),
        ("{% import 'macros.j2' as m %}", "cannot include or import"),
        ("{% from 'macros.j2' import x %}", "cannot include or import"),
        ("{% extends 'base.j2' %}", "cannot include or import"),
        ("{{ messages.append({'role': 'x'}) }}", "not allowed"),  # immutable sandbox
        ("{{ messages[0].update({'role': 'x'}) }}", "not allowed"),
        ("{{ lipsum(1000000) }}", "undefined"),
        ("{{ 'a' * 100000000 }}", "repetition"),
        ("{{ [0] * 100000000 }}", "repetition"),
        ("{{ 10 ** 100000000 }}", "exponent"),
        ("{{ range(100000000) | list }}", "Range too big"),
        ("{% generation %}{{ ''.__class__ }}{% endgeneration %}", "not allowed"),  # the tag's body is sandboxed too
        ("{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}", "failed to render"),
        ("{% set ns = namespace(x=[]) %}{% for i in range(10) %}{% set ns.x = ns.x + ns.x + [0] %}{% endfor %}"
         "{{ ns.x | length }}{{ 'y' * (ns.x | length) * 1000 }}", "repetition"),
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "range items"),
    ],
)
def test_sandbox_blocks_files_mutation_and_runaway_work(src, match):
    with pytest.raises(TemplateError, match=match):
        ChatTemplate(src).render(CHAT[:1])


@pytest.mark.parametrize(
    "src, match",
    [
        # loops and calls have a step budget
        ("{% for c in 'a' * 100000 %}{% for d in 'a' * 100000 %}{% endfor %}{% endfor %}", "steps"),
        ("{% macro f(n) %}{% if n < 40 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}", "calls"),
        # doubling with ~ and +, lists of the same list, numbers of many bits
        ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "long"),
        ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "long"),
        ("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}",
         "structure"),
        ("{{ [[1] * 100000] * 100000 }}", "structure"),
        ("{% set ns = namespace(x=7) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}", "bits"),
        # filters and methods that widen a string
        ("{{ 'x'|center(10**9) }}", "long"), ("{{ 'x'|indent(10**9) }}", "long"),
        ("{{ ('x' * 1000)|replace('', 'y' * 100000) }}", "long"), ("{{ range(100000)|join(',' * 100000) }}", "long"),
        ("{{ [1]|batch(10**9, 0)|list }}", "items"), ("{{ [1]|slice(10**9)|list }}", "items"),
        ("{{ [[1], [2]]|sum(start=[]) }}", "numbers only"), ("{{ 1|tojson(indent=10**9) }}", "indent"),
        ("{{ 'a b'|wordwrap(1, wrapstring='x' * 100000) * 1 }}", "long"),
        ("{{ 'x'.ljust(10**9) }}", "long"), ("{{ 'x'.zfill(10**9) }}", "long"),
        ("{{ ('\t' * 1000).expandtabs(10**6) }}", "long"), ("{{ ','.join(['x'] * 1000) * 1 }}", None),
        ("{{ ('a' * 1000).translate({97: 'b' * 100000}) }}", "long"),
        # printf and str.format widths
        ("{{ '%999999999s'|format('x') }}", "long"), ("{{ '%999999999s' % 'x' }}", "long"),
        ("{{ '%*s'|format(10**9, 'x') }}", "widths"), ("{{ '{:>999999999}'.format('x') }}", "long"),
        ("{{ '{:{w}}'.format('x', w=10**9) }}", "nested"),
    ],
)
def test_sandbox_bounds_the_work_of_a_render(src, match):
    if match is None:  # within the bounds: renders
        assert ChatTemplate(src).render(CHAT[:1]) == ",".join(["x"] * 1000)
        return
    with pytest.raises(TemplateError, match=match):
        ChatTemplate(src).render(CHAT[:1])


def test_nothing_is_evaluated_while_compiling():
    """Jinja folds constant expressions while compiling, outside the sandbox's checks: off."""
    t = ChatTemplate("{{ '%999999999s'|format('x') }}{{ 'x'.ljust(10**9) }}")  # returns at once
    with pytest.raises(TemplateError, match="long"):
        t.render(CHAT[:1])


def test_step_budget_is_per_render():
    t = ChatTemplate("{% for c in 'a' * 90000 %}{% endfor %}{{ messages | length }}")
    for _ in range(30):  # 30 x 90000 steps are over the budget in total, not within one render
        assert t.render(CHAT) == "3"


def test_range_budget_is_per_render():
    t = ChatTemplate("{% for i in range(90000) %}{% endfor %}{{ messages | length }}")
    for _ in range(15):  # 15 x 90000 is over the budget in total, not within one render
        assert t.render(CHAT) == "3"


def test_template_syntax_error_is_reported_at_construction():
    with pytest.raises(TemplateError, match="syntax error at line 2"):
        ChatTemplate("ok\n{% for m in messages %}")
    with pytest.raises(TemplateError, match="must be a string"):
        ChatTemplate(b"{{ x }}")


def test_runtime_failures_are_template_errors():
    with pytest.raises(TemplateError, match="failed to render"):
        ChatTemplate("{{ messages[0]['content'] + 1 }}").render(CHAT[:1])
    with pytest.raises(TemplateError, match="failed to render"):
        ChatTemplate("{{ undefined_thing.attr }}").render(CHAT[:1])
    with pytest.raises(TemplateError, match="failed to render"):
        ChatTemplate("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").render(CHAT[:1])


# --------------------------------------------------------------------------------------------
# messages


def test_text_parts_are_joined_with_newlines():
    t = ChatTemplate(None)
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    assert t.render([{"role": "user", "content": parts}], add_generation_prompt=False) == (
        "<|im_start|>user\none\ntwo<|im_end|>\n"
    )


def test_extra_message_keys_reach_the_template_and_input_is_not_modified():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "x"}], "name": "ann"}]
    assert ChatTemplate("{{ messages[0]['name'] }}:{{ messages[0]['content'] }}").render(msgs) == "ann:x"
    assert msgs[0]["content"] == [{"type": "text", "text": "x"}]


@pytest.mark.parametrize(
    "messages, match",
    [
        ("hello", "must be a list of dicts"),
        ({"role": "user", "content": "x"}, "must be a list of dicts"),
        ([], "empty"),
        (["hello"], "message 0 must be a dict"),
        ([{"content": "x"}], "message 0: 'role' must be a non-empty string"),
        ([{"role": 3, "content": "x"}], "'role' must be a non-empty string"),
        ([{"role": "user"}], r"message 0 \(user\) has no 'content'"),
        ([{"role": "user", "content": "x"}, {"role": "user", "content": 5}], r"message 1 \(user\): 'content' must be"),
        ([{"role": "user", "content": None}], "'content' must be a string or a list"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}], "content part 0 must be"),
        ([{"role": "user", "content": [{"type": "text"}]}], "content part 0 has no string 'text'"),
        ([{"role": "user", "content": ["plain"]}], "content part 0 must be"),
    ],
)
def test_bad_messages_are_rejected_clearly(messages, match):
    with pytest.raises(TemplateError, match=match):
        ChatTemplate(None).render(messages)
