"""What a chat template does with tools, probed (ChatTemplate.tool_caps), and prompts built from
it (tool_calls.prepare_turn): on every template in llama.cpp's models/templates a conversation
with tools, calls and their results keeps them all, the tools listed once; and each capability on
a small template written to have or lack it."""

from __future__ import annotations

import json

import pytest

from edgellm.chat import ChatTemplate
from edgellm.errors import TemplateError
from edgellm.tool_calls import ToolFormat, detect_format, parse, prepare_messages, prepare_turn, write_calls
from llamacpp_source import models_dir

DESCRIPTION = "Get the current weather in a city"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": DESCRIPTION,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
QUESTION = "What is the weather in the two largest cities of the Rhone valley?"
CITIES = ("Lyon", "Valence")
RESULTS = ("Sunny, 18 C", "Cloudy, 14 C")  # no quotes: a template may write a result through tojson


def call(i: int) -> dict:
    return {"id": f"call{i}ABCD", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": CITIES[i]})}}


def conversation(n_calls: int) -> list[dict]:
    return ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": QUESTION},
             {"role": "assistant", "content": None, "tool_calls": [call(i) for i in range(n_calls)]}]
            + [{"role": "tool", "tool_call_id": f"call{i}ABCD", "content": RESULTS[i]} for i in range(n_calls)])


# templates no conversation with OpenAI's tools renders through, and why
CANNOT = {
    # (as transformers renders it: tools whose parameters all have a description do render, see below)
    "CohereForAI-c4ai-command-r-plus-tool_use": "prints each parameter's description, and get_weather's city has none",
}
NAMES = sorted(p.stem for p in (models_dir() / "templates").glob("*.jinja"))


def own_listing(t: ChatTemplate) -> int:
    """How often the template itself writes the tool's description for a bare question."""
    try:
        return t.render([{"role": "user", "content": QUESTION}], tools=TOOLS).count(DESCRIPTION)
    except TemplateError:
        return 0


@pytest.mark.parametrize("name", NAMES)
def test_every_template_keeps_tools_calls_and_results(name):
    t = ChatTemplate((models_dir() / "templates" / f"{name}.jinja").read_text(encoding="utf-8"),
                     bos_token="<s>", eos_token="</s>")
    for n_calls in (1, 2):
        if name in CANNOT:
            with pytest.raises(TemplateError):
                prepare_turn(t, conversation(n_calls), TOOLS)
            continue
        prompt = prepare_turn(t, conversation(n_calls), TOOLS).prompt
        assert QUESTION in prompt
        after = prompt.split(QUESTION, 1)[1]
        for i in range(n_calls):
            assert CITIES[i] in after, (n_calls, "call", i)
            assert RESULTS[i] in after, (n_calls, "result", i)
            assert after.index(CITIES[i]) < after.index(RESULTS[i])  # a result after its call
        # listed by the template, or else once in the system message; never both
        assert prompt.count(DESCRIPTION) == max(own_listing(t), 1), n_calls


def test_templates_that_read_more_than_transformers_gives_them():
    def load(name):
        return ChatTemplate((models_dir() / "templates" / f"{name}.jinja").read_text(encoding="utf-8"))

    # FireFunction v2 reads `functions` (the tools as JSON) and `datetime`, which llama.cpp passes it
    fire = load("fireworks-ai-llama-3-firefunction-v2")
    prompt = prepare_turn(fire, conversation(2), TOOLS).prompt
    assert prompt.count(DESCRIPTION) == 1 and "\nToday is " in prompt
    assert ' functools[{"name": "get_weather", "arguments": {"city": "Lyon"}}, ' in prompt and RESULTS[1] in prompt
    assert "Available functions as JSON spec:\n\nToday is" in prepare_turn(fire, [{"role": "user", "content": "hi"}]).prompt
    # Command R+ prints each parameter's description (so does the probe tool): with one, everything renders
    command = load("CohereForAI-c4ai-command-r-plus-tool_use")
    described = [{"type": "function", "function": {**TOOLS[0]["function"], "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "description": "The city"}}, "required": ["city"]}}}]
    after = prepare_turn(command, conversation(2), described).prompt.split(QUESTION)[1]
    assert all(x in after for x in CITIES + RESULTS) and '"tool_name": "get_weather"' in after
    with pytest.raises(TemplateError, match="description"):
        prepare_turn(command, conversation(1), TOOLS)


# --------------------------------------------------------------------------------------------
# each capability on a small template

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
          "{% for c in m.tool_calls or [] %}[call {{ c.function.name }} {{ ARGS }}]{% endfor %}"
          "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chatml(args: str = "c.function.arguments | tojson", tools: bool = False, skip_role: str | None = None,
           calls: str = "m.tool_calls or []") -> ChatTemplate:
    src = CHATML.replace("{{ ARGS }}", "{{ " + args + " }}" if args else "").replace("m.tool_calls or []", calls)
    if tools:
        src = "{% for t in tools or [] %}[tool {{ t.function.name }}: {{ t.function.description }}]{% endfor %}" + src
    if skip_role:
        src = src.replace("{% for m in messages %}", "{% for m in messages %}{% if m.role != '" + skip_role + "' %}")
        src = src.replace("<|im_end|>\n{% endfor %}", "<|im_end|>\n{% endif %}{% endfor %}")
    return ChatTemplate(src)


def caps_of(t: ChatTemplate) -> tuple:
    c = t.tool_caps
    return (c.supports_tools, c.supports_tool_calls, c.object_arguments, c.requires_object_arguments,
            c.supports_parallel_tool_calls, c.supports_tool_responses)


def test_a_template_that_lists_tools_gets_no_second_listing():
    listing = chatml(tools=True)
    assert listing.tool_caps.supports_tools
    prompt = prepare_turn(listing, [{"role": "user", "content": "hi"}], TOOLS).prompt
    assert prompt.count(DESCRIPTION) == 1 and prompt.startswith("[tool get_weather")
    plain = chatml()
    assert not plain.tool_caps.supports_tools
    prompt = prepare_turn(plain, [{"role": "user", "content": "hi"}], TOOLS).prompt
    assert prompt.count(DESCRIPTION) == 1 and prompt.startswith("<|im_start|>system\nYou can call these tools")


def test_tool_results_a_template_drops_become_a_user_message():
    t = chatml(skip_role="tool")
    assert caps_of(t) == (False, True, True, True, True, False)
    msgs = conversation(2) + [{"role": "user", "content": "And tomorrow?"}]
    prompt = prepare_turn(t, msgs, TOOLS).prompt
    # both results in one user turn, with the question after them (roles still alternate)
    turn = prompt.split("<|im_start|>user\n")[-1].split("<|im_end|>")[0]
    assert turn == ("Tool result (tool get_weather, call call0ABCD):\nSunny, 18 C\n\n"
                    "Tool result (tool get_weather, call call1ABCD):\nCloudy, 14 C\n\nAnd tomorrow?")
    kept = chatml()  # renders role "tool": the results stay tool messages
    assert kept.tool_caps.supports_tool_responses
    assert "<|im_start|>tool\nSunny, 18 C<|im_end|>" in prepare_turn(kept, conversation(1), TOOLS).prompt


def test_a_template_that_raises_on_a_probe_counts_as_not_supporting_it():
    strict = chatml().source.replace(
        "{% for m in messages %}", "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}"
                                   "{% endif %}")
    t = ChatTemplate(strict)
    assert caps_of(t) == (False, True, True, True, True, False)
    assert "Tool result (tool get_weather, call call0ABCD):\nSunny, 18 C" in prepare_turn(t, conversation(1)).prompt
    on_tools = ChatTemplate("{% if tools %}{{ raise_exception('no') }}{% endif %}" + chatml().source)
    assert not on_tools.tool_caps.supports_tools
    assert DESCRIPTION in prepare_turn(on_tools, [{"role": "user", "content": "hi"}], TOOLS).prompt  # not given tools=


def test_arguments_go_in_as_the_template_renders_them():
    items = chatml("c.function.arguments.items() | map('join', '=') | join(',')")  # an object only
    assert caps_of(items)[1:4] == (True, True, True)
    assert "[call get_weather city=Lyon]" in prepare_turn(items, conversation(1), TOOLS).prompt
    text = chatml("c.function.arguments")  # prints the text (an object would come out as Python's repr)
    assert caps_of(text)[1:4] == (True, False, False)
    assert '[call get_weather {"city": "Lyon"}]' in prepare_turn(text, conversation(1), TOOLS).prompt
    tojson = chatml()  # the JSON text comes out escaped: an object
    assert caps_of(tojson)[1:4] == (True, True, True)
    assert '[call get_weather {"city": "Lyon"}]' in prepare_turn(tojson, conversation(1), TOOLS).prompt
    either = chatml("c.function.arguments if c.function.arguments is string else c.function.arguments | tojson")
    assert caps_of(either)[1:4] == (True, True, False)
    assert '[call get_weather {"city": "Lyon"}]' in prepare_turn(either, conversation(1), TOOLS).prompt


def test_several_calls_for_a_template_that_renders_one_go_one_message_each():
    first = chatml(calls="(m.tool_calls or [])[:1]")
    assert caps_of(first)[1] and not first.tool_caps.supports_parallel_tool_calls
    prompt = prepare_turn(first, conversation(2), TOOLS).prompt
    assert prompt.split(QUESTION)[1].startswith(
        '<|im_end|>\n<|im_start|>assistant\n[call get_weather {"city": "Lyon"}]<|im_end|>\n'
        '<|im_start|>tool\nSunny, 18 C<|im_end|>\n'
        '<|im_start|>assistant\n[call get_weather {"city": "Valence"}]<|im_end|>\n'
        '<|im_start|>tool\nCloudy, 14 C<|im_end|>\n')
    assert chatml().tool_caps.supports_parallel_tool_calls


def test_calls_a_template_cannot_render_become_the_assistants_text_in_its_format():
    t = chatml(args="", calls="[]")
    assert caps_of(t) == (False, False, False, False, False, True)
    hermes = ChatTemplate(t.source + "{# <tool_call> #}")
    assert detect_format(hermes.source).name == "hermes"
    for template in (t, hermes):
        fmt = detect_format(template.source)
        msgs = prepare_messages(conversation(2), fmt, template.tool_caps)
        assert "tool_calls" not in msgs[2]
        assert [json.loads(c["function"]["arguments"]) for c in parse(fmt, msgs[2]["content"])[1]] == \
            [{"city": "Lyon"}, {"city": "Valence"}]
        assert "Valence" in prepare_turn(template, conversation(2), TOOLS).prompt


def test_capabilities_are_probed_once(monkeypatch):
    t = chatml(tools=True)
    renders = []
    assert t.supports_system_role  # (probed apart)
    real = t._render
    monkeypatch.setattr(t, "_render", lambda *a, **k: renders.append(1) or real(*a, **k))
    first = t.tool_caps
    probes = len(renders)
    assert probes >= 4
    prepare_turn(t, conversation(2), TOOLS)
    assert t.tool_caps is first and len(renders) == probes + 1  # the prompt itself only


@pytest.mark.parametrize("fmt", ["hermes", "llama3", "mistral", "mistral_args", "functionary", "function_tag", "generic",
                                 "granite", "deepseek_r1", "deepseek_v3", "command_r7b", "qwen3_coder", "glm", "kimi_k2", "seed_oss",
                                 "gpt_oss", "apertus", "nemotron_v2", "apriel", "minimax_m1", "minimax_m2", "lfm2", "command_r_plus", "firefunction_v2",
                                 "deepseek_v32", "deepseek_v4", "hy3", "gigachat_v3", "gigachat_v31",
                                 "solar_open", "gemma4", "minicpm5", "kimi_k3"])
def test_written_calls_parse_back(fmt):
    f = ToolFormat(fmt, fmt != "generic")
    calls = [{"name": "get_weather", "arguments": {"city": c}} for c in CITIES]
    for some in (calls[:1], calls):
        back = parse(f, write_calls(f, some))[1]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in back] == \
            [(c["name"], c["arguments"]) for c in some]


@pytest.mark.parametrize("calls", ["get_weather", ["get_weather"], [{"id": "c1"}], [{"function": {"name": ""}}],
                                   [{"id": ["c1"], "function": {"name": "f"}}], [{"function": {"name": "f", "arguments": 3}}]])
def test_malformed_tool_calls_are_clear_errors(calls):
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": calls}]
    for t in (chatml(), chatml(args="", calls="[]")):  # rendered as calls, or as text
        with pytest.raises(TemplateError, match=r"message 1: tool_calls"):
            prepare_turn(t, msgs, TOOLS)
