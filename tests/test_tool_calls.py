"""Tool calls: formats detected from llama.cpp's templates, parsed back into OpenAI tool_calls,
forced by grammars for tool_choice "required" / a named function, and a tool result that
continues the conversation, on a real model with three template families."""

from __future__ import annotations

import json
import os

import pytest

import template_cases as cases
from edgellm.constrain import Grammar
from edgellm.errors import GrammarError, TemplateError
from edgellm.tool_calls import (ToolFormat, call_grammar, detect_format, parse, prepare_messages, split_reasoning,
                                write_calls)
from llamacpp_source import models_dir
from test_constrain import llguidance_matcher

TOOLS = cases.TOOLS + [{"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}]


def template(name: str) -> str:
    return (models_dir() / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


@pytest.mark.parametrize("name, fmt", [
    ("Qwen-Qwen2.5-7B-Instruct", "hermes"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes"),
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3"),
    ("meta-llama-Llama-3.3-70B-Instruct", "llama3"),
    ("mistralai-Mistral-Nemo-Instruct-2407", "mistral"),
    ("Mistral-Small-3.2-24B-Instruct-2506", "mistral_args"),
    ("meetkai-functionary-medium-v3.2", "functionary"),
    ("meetkai-functionary-medium-v3.1", "function_tag"),
    # no tool support in their templates, and llama.cpp reads their replies as content only (its
    # autoparser finds no call format where the template renders no calls): the generic format
    ("google-gemma-2-2b-it", "generic"),
    ("microsoft-Phi-3.5-mini-instruct", "generic"),
    ("llama-cpp-rwkv-world", "generic"),
    ("HuggingFaceTB-SmolLM3-3B", "hermes"),  # (formats._smollm3)
    ("ibm-granite-granite-3.3-2B-Instruct", "granite"),
    ("ibm-granite-granite-4.0", "hermes"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "deepseek_r1"),
    ("llama-cpp-deepseek-r1", "deepseek_r1"),
    ("deepseek-ai-DeepSeek-V3.1", "deepseek_v3"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "command_r7b"),
    ("Cohere2MoE", "command_r7b"),
    ("Qwen3-Coder", "qwen3_coder"),
    ("Qwen3.5-4B", "qwen3_coder"),
    ("Qwen-Qwen3-0.6B", "hermes"),
    ("GLM-4.6", "glm"),
    ("poolside-Laguna-XS.2", "glm"),
    ("Kimi-K2-Instruct", "kimi_k2"),
    ("ByteDance-Seed-OSS", "seed_oss"),
    ("moonshotai-Kimi-K2", "kimi_k2"),
    ("openai-gpt-oss-120b", "gpt_oss"),
    ("Apertus-8B-Instruct", "apertus"),
    ("NVIDIA-Nemotron-Nano-v2", "nemotron_v2"),
    ("Apriel-1.6-15b-Thinker-fixed", "apriel"),
    ("unsloth-Apriel-1.5", "apriel"),
    ("MiniMax-M1", "minimax_m1"),
    ("MiniMax-M2", "minimax_m2"),
    ("LFM2-8B-A1B", "lfm2"),
    ("LFM2.5-8B-A1B", "lfm2"),
    ("LFM2.5-Instruct", "lfm2"),
    ("CohereForAI-c4ai-command-r-plus-tool_use", "command_r_plus"),
    ("fireworks-ai-llama-3-firefunction-v2", "firefunction_v2"),
    ("deepseek-ai-DeepSeek-V3.2", "deepseek_v32"),
    ("deepseek-ai-DeepSeek-V4", "deepseek_v4"),
    ("deepseek-ai-DeepSeek-V4-Flash-0731", "deepseek_v4"),
    ("tencent-Hy3", "hy3"),
    ("GigaChat3-10B-A1.8B", "gigachat_v3"),
    ("GigaChat3.1-10B-A1.8B", "gigachat_v31"),
    ("upstage-Solar-Open-100B", "solar_open"),
    ("google-gemma-4-31B-it", "gemma4"),
    ("google-gemma-4-31B-it-interleaved", "gemma4"),
    ("openbmb-MiniCPM5-1B", "minicpm5"),
    ("Kimi-K3", "kimi_k3"),
    ("muse-glimmer", "muse_glimmer"),
])
def test_format_is_detected_from_the_template(name, fmt):
    assert detect_format(template(name)).name == fmt


CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
WRITTEN = {
    "hermes": 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "llama3": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123DEF"}]',
    "mistral_args": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
    "functionary": '>>>get_weather\n{"city": "Paris"}',
    "function_tag": '<function=get_weather>{"city": "Paris"}</function>',
    "generic": '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}',
    # as the templates write an assistant's call (ibm-granite-granite-3.3-2B-Instruct's instructions,
    # deepseek-ai-DeepSeek-R1-Distill-Qwen-32B, deepseek-ai-DeepSeek-V3.1,
    # CohereForAI-c4ai-command-r7b-12-2024-tool_use, Qwen3-Coder, GLM-4.6)
    "granite": '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    "deepseek_r1": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
                   '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseek_v3": 'Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
                   '<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "command_r7b": '<|START_THINKING|>Let me check.<|END_THINKING|><|START_ACTION|>[\n    {"tool_call_id": "0", '
                   '"tool_name": "get_weather", "parameters": {"city": "Paris"}}\n]<|END_ACTION|>',
    "qwen3_coder": 'Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n'
                   '</function>\n</tool_call>',
    "kimi_k2": '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
               '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
    "seed_oss": '<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>\n</seed:tool_call>',
    "glm": '<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>',
    "apertus": '<|tools_prefix|>[{"get_weather": {"city": "Paris"}}]<|tools_suffix|>',
    "nemotron_v2": '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>',
    "apriel": 'Let me check.\n<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_calls>',
    "minimax_m1": '<tool_calls>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_calls>',
    "command_r_plus": 'Let me check.\nAction:\n```json\n[\n    {\n        "tool_name": "get_weather",\n        "parameters": '
                      '{\n            "city": "Paris"\n        }\n    }\n]```',
    "deepseek_v32": 'Let me check.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
                    'string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
    "deepseek_v4": '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris'
                   '</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
    "hy3": '<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n<arg_key:opensource>city'
           '</arg_key:opensource>\n<arg_value:opensource>Paris</arg_value:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>',
    "gigachat_v3": 'Let me check.<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "gigachat_v31": 'Let me check.<|function_call|>{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "solar_open": '<|tool_calls|><|tool_call:begin|>a1b2c3d4e5<|tool_call:name|>get_weather<|tool_call:args|>{"city": "Paris"}'
                  '<|tool_call:end|>',  # (<|calls|>, which would follow, ends generation)
    "gemma4": 'Let me check.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
    "minicpm5": '<function name="get_weather"><param name="city">Paris</param></function>',
    "kimi_k3": ('<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city" type="string"'
                '<|sep|>Paris<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>'),
    "firefunction_v2": ' functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    "lfm2": "Let me check.<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>",  # (as LFM2.5-8B-A1B writes it)
    "minimax_m2": 'Let me check.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
                  '</invoke>\n</minimax:tool_call>',
    # (after the prompt's <|start|>assistant; <|call|> ends generation, so it is not in the text)
    "gpt_oss": '<|channel|>analysis<|message|>Let me check.<|end|><|start|>assistant<|channel|>commentary '
               'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}',
    # (after the prompt's <|start|>assistant; <|eot|> ends generation)
    "muse_glimmer": ' to=self<|message|>Let me check.<|eom|><|start|>assistant to=get_weather<|message|><atem:function_calls>\n'
                    '<atem:invoke name="get_weather">\n<atem:parameter name="city">Paris</atem:parameter>\n</atem:invoke>\n'
                    '</atem:function_calls>',
}
PROSE = {"hermes": "Let me check.", "gemma4": "Let me check.", "gigachat_v3": "Let me check.", "gigachat_v31": "Let me check.", "deepseek_v32": "Let me check.", "command_r_plus": "Let me check.", "lfm2": "Let me check.", "apriel": "Let me check.", "minimax_m2": "Let me check.", "deepseek_v3": "Let me check.", "qwen3_coder": "Let me check.",
         "command_r7b": "<|START_THINKING|>Let me check.<|END_THINKING|>"}
# a call as call_grammar writes it, where the model may write it another way too
FORCED = {"hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
          "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
          "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
          "deepseek_v3": WRITTEN["deepseek_v3"][len("Let me check."):],
          "command_r7b": '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}]'
                         '<|END_ACTION|>',
          "qwen3_coder": WRITTEN["qwen3_coder"][len("Let me check.\n"):],
          "gpt_oss": WRITTEN["gpt_oss"].split("<|start|>assistant")[1],
          "apriel": WRITTEN["apriel"][len("Let me check.\n"):],
          "minimax_m2": WRITTEN["minimax_m2"][len("Let me check.\n"):],
          "lfm2": '<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>',
          "command_r_plus": 'Action:\n```json\n[{"tool_name": "get_weather", "parameters": {"city": "Paris"}}]```',
          "firefunction_v2": 'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
          "deepseek_v32": WRITTEN["deepseek_v32"][len("Let me check.\n\n"):],
          "gigachat_v3": WRITTEN["gigachat_v3"][len("Let me check."):],
          "gigachat_v31": WRITTEN["gigachat_v31"][len("Let me check."):],
          "gemma4": WRITTEN["gemma4"][len("Let me check."):]}
# two calls, where they are not the forced call twice one after another
TWO = {"mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                  '{"name": "get_time", "arguments": {"zone": "CET"}}]',
       "granite": '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                  '{"name": "get_time", "arguments": {"zone": "CET"}}]',
       "command_r7b": '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}, '
                      '{"tool_call_id": "1", "tool_name": "get_time", "parameters": {"zone": "CET"}}]<|END_ACTION|>',
       **{ds: FORCED.get(ds, WRITTEN[ds]).replace("<｜tool▁calls▁end｜>", sep) + FORCED.get(ds, WRITTEN[ds]).replace(
           "Paris", "Rome").replace("<｜tool▁calls▁begin｜>", "") for ds, sep in (("deepseek_r1", "\n"), ("deepseek_v3", ""))}}
TWO.update({
    "kimi_k3": WRITTEN["kimi_k3"].replace("<|close|>tools<|sep|>", "") + '<|open|>call tool="get_time" index="2"<|sep|>'
               '<|open|>argument key="zone" type="string"<|sep|>CET<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>',
    "minicpm5": WRITTEN["minicpm5"] + '\n<function name="get_time"><param name="zone">CET</param></function>',
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_call>call:get_time{zone:<|"|>CET<|"|>}'
              '<tool_call|>',
    "solar_open": WRITTEN["solar_open"] + '<|tool_call:begin|>f6g7h8i9j0<|tool_call:name|>get_time<|tool_call:args|>'
                                          '{"zone": "CET"}<|tool_call:end|>',
    "hy3": WRITTEN["hy3"].replace("</tool_calls:opensource>", "") + '<tool_call:opensource>get_time<tool_sep:opensource>\n'
           '<arg_key:opensource>zone</arg_key:opensource>\n<arg_value:opensource>CET</arg_value:opensource>\n</tool_call:opensource>\n'
           '</tool_calls:opensource>',
    **{ds: FORCED.get(ds, WRITTEN[ds]).replace(f"</｜DSML｜{block}>", "") + '<｜DSML｜invoke name="get_time">\n'
           f'<｜DSML｜parameter name="zone" string="true">CET</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜{block}>'
       for ds, block in (("deepseek_v32", "function_calls"), ("deepseek_v4", "tool_calls"))},
    "command_r_plus": 'Action:\n```json\n[{"tool_name": "get_weather", "parameters": {"city": "Paris"}}, '
                      '{"tool_name": "get_time", "parameters": {"zone": "CET"}}]```',
    "firefunction_v2": 'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                       '{"name": "get_time", "arguments": {"zone": "CET"}}]',
    "lfm2": '<|tool_call_start|>[get_weather(city="Paris"), get_time(zone="CET")]<|tool_call_end|>',
    "minimax_m2": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n</invoke>\n'
                  '<invoke name="get_time">\n<parameter name="zone">CET</parameter>\n</invoke>\n</minimax:tool_call>',
    "apertus": '<|tools_prefix|>[{"get_weather": {"city": "Paris"}}, {"get_time": {"zone": "CET"}}]<|tools_suffix|>',
    "nemotron_v2": '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                   '{"name": "get_time", "arguments": {"zone": "CET"}}]</TOOLCALL>',
    "apriel": '<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
              '{"name": "get_time", "arguments": {"zone": "CET"}}]</tool_calls>',
    "minimax_m1": '<tool_calls>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                  '{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_calls>'})
TWO["gpt_oss"] = FORCED["gpt_oss"] + "<|call|><|start|>assistant" + FORCED["gpt_oss"].replace("Paris", "Rome")
TWO["muse_glimmer"] = WRITTEN["muse_glimmer"] + "<|eom|><|start|>assistant" + WRITTEN["muse_glimmer"].split(
    "<|start|>assistant")[1].replace("Paris", "Rome")
TWO["kimi_k2"] = WRITTEN["kimi_k2"].replace("<|tool_calls_section_end|>", "") + WRITTEN["kimi_k2"].replace(
    "Paris", "Rome").replace(":0", ":1").replace("<|tool_calls_section_begin|>", "")
SEVERAL = ("muse_glimmer", "kimi_k3", "minicpm5", "gemma4", "solar_open", "hy3", "deepseek_v32", "deepseek_v4", "command_r_plus", "firefunction_v2", "lfm2", "minimax_m2", "apertus", "nemotron_v2", "apriel", "minimax_m1", "kimi_k2", "seed_oss", "hermes", "mistral", "mistral_args", "function_tag", "granite", "deepseek_r1", "deepseek_v3", "command_r7b",
           "qwen3_coder", "glm")


@pytest.mark.parametrize("fmt", sorted(WRITTEN))
def test_written_calls_parse_into_openai_tool_calls(fmt):
    content, calls = parse(ToolFormat(fmt, fmt != "generic"), WRITTEN[fmt])
    assert len(calls) == 1 and calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert content == PROSE.get(fmt, "")


@pytest.mark.parametrize("fmt", sorted(WRITTEN))
def test_text_that_is_no_call_stays_content(fmt):
    f = ToolFormat(fmt, fmt != "generic")
    assert parse(f, "It is sunny.") == ("It is sunny.", [])
    assert parse(f, WRITTEN[fmt][:-3])[1] == []  # a call cut short is not a call
    if fmt == "generic":
        assert parse(f, '{"response": "It is sunny."}') == ("It is sunny.", [])


@pytest.mark.parametrize("fmt", sorted(WRITTEN))
def test_required_call_grammar_admits_exactly_a_call(fmt):
    f = ToolFormat(fmt, fmt != "generic")
    accepts = llguidance_matcher(Grammar.from_lark(call_grammar(f, TOOLS)))
    call = FORCED.get(fmt, WRITTEN[fmt])
    assert accepts(call)
    assert not accepts("It is sunny.")
    assert not accepts(call.replace("get_weather", "get_wether"))  # only the tools given
    named = llguidance_matcher(Grammar.from_lark(call_grammar(f, TOOLS[1:])))
    assert not named(call)


@pytest.mark.parametrize("fmt", sorted(WRITTEN))
def test_parallel_call_grammar_admits_several_calls_where_the_format_writes_them(fmt):
    f = ToolFormat(fmt, fmt != "generic")
    one = FORCED.get(fmt, WRITTEN[fmt])
    sep = "\n" if fmt in ("hermes", "qwen3_coder", "seed_oss", "glm") else ""
    two = TWO.get(fmt, one + sep + one.replace("Paris", "Rome"))
    single = llguidance_matcher(Grammar.from_lark(call_grammar(f, TOOLS)))
    several = llguidance_matcher(Grammar.from_lark(call_grammar(f, TOOLS, parallel=True)))
    assert not single(two)
    assert several(two) == (fmt in SEVERAL)
    if fmt != "mistral":
        assert several(one)
    assert not several("It is sunny.")
    if fmt != "generic":  # and the calls parse back
        assert len(parse(f, two)[1]) == 2


ALARM = [{"type": "function", "function": {"name": "set_alarm", "parameters": {"type": "object", "properties": {
    "hour": {"type": "integer"}, "label": {"type": "string"}, "days": {"type": "array", "items": {"type": "string"}}},
    "required": ["hour"]}}}]


@pytest.mark.parametrize("fmt", ["qwen3_coder", "seed_oss", "glm", "minimax_m2", "deepseek_v4", "hy3", "minicpm5", "kimi_k3"])
def test_xml_arguments_are_text_where_the_schema_says_string_else_json(fmt):
    f = ToolFormat(fmt, True)
    written = {"qwen3_coder": '<tool_call>\n<function=set_alarm>\n<parameter=hour>\n7\n</parameter>\n<parameter=label>\n'
                              '42\n</parameter>\n<parameter=days>\n["mon", "tue"]\n</parameter>\n</function>\n</tool_call>',
               "seed_oss": '<seed:tool_call>\n<function=set_alarm>\n<parameter=hour>7</parameter>\n<parameter=label>42'
                           '</parameter>\n<parameter=days>["mon", "tue"]</parameter>\n</function>\n</seed:tool_call>',
               "glm": '<tool_call>set_alarm\n<arg_key>hour</arg_key>\n<arg_value>7</arg_value>\n<arg_key>label</arg_key>\n'
                      '<arg_value>42</arg_value>\n<arg_key>days</arg_key>\n<arg_value>["mon", "tue"]</arg_value>\n'
                      '</tool_call>',
               "minimax_m2": '<minimax:tool_call>\n<invoke name="set_alarm">\n<parameter name="hour">7</parameter>\n'
                             '<parameter name="label">42</parameter>\n<parameter name="days">["mon", "tue"]</parameter>\n'
                             '</invoke>\n</minimax:tool_call>',
               "deepseek_v4": '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="set_alarm">\n<｜DSML｜parameter name="hour" string="false">7'
                              '</｜DSML｜parameter>\n<｜DSML｜parameter name="label" string="true">42</｜DSML｜parameter>\n'
                              '<｜DSML｜parameter name="days" string="false">["mon", "tue"]</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
                              '</｜DSML｜tool_calls>',
               "hy3": '<tool_calls:opensource>\n<tool_call:opensource>set_alarm<tool_sep:opensource>\n<arg_key:opensource>hour'
                      '</arg_key:opensource>\n<arg_value:opensource>7</arg_value:opensource>\n<arg_key:opensource>label'
                      '</arg_key:opensource>\n<arg_value:opensource>42</arg_value:opensource>\n<arg_key:opensource>days'
                      '</arg_key:opensource>\n<arg_value:opensource>["mon", "tue"]</arg_value:opensource>\n</tool_call:opensource>\n'
                      '</tool_calls:opensource>',
               "minicpm5": '<function name="set_alarm"><param name="hour">7</param><param name="label">42</param>'
                           '<param name="days">["mon", "tue"]</param></function>',
               "kimi_k3": '<|open|>tools<|sep|><|open|>call tool="set_alarm" index="1"<|sep|><|open|>argument key="hour" '
                          'type="number"<|sep|>7<|close|>argument<|sep|><|open|>argument key="label" type="string"<|sep|>42'
                          '<|close|>argument<|sep|><|open|>argument key="days" type="array"<|sep|>["mon", "tue"]<|close|>argument'
                          '<|sep|><|close|>call<|sep|><|close|>tools<|sep|>'}[fmt]
    calls = parse(f, written, ALARM)[1]
    assert json.loads(calls[0]["function"]["arguments"]) == {"hour": 7, "label": "42", "days": ["mon", "tue"]}
    accepts = llguidance_matcher(Grammar.from_lark(call_grammar(f, ALARM)))
    assert accepts(written)
    assert not accepts(written.replace("7", '"seven"', 1))  # an integer, as JSON
    assert accepts(write_calls(f, [{"name": "set_alarm", "arguments": {"hour": 7}}]))
    assert not accepts(write_calls(f, [{"name": "set_alarm", "arguments": {"label": "x"}}]))  # hour is required


# strings held to a pattern, lengths and a const, a number to a range; two required, two not
BOOKING = [{"type": "function", "function": {"name": "book", "parameters": {"type": "object", "properties": {
    "code": {"type": "string", "pattern": "^[A-Z]{3}$"}, "seats": {"type": "integer", "minimum": 1, "maximum": 9},
    "note": {"type": "string", "minLength": 2, "maxLength": 6}, "ref": {"type": "string", "pattern": "[0-9]"},
    "kind": {"type": "string", "const": "flight"}}, "required": ["code", "seats"]}}}]


@pytest.mark.parametrize("fmt", ["qwen3_coder", "seed_oss", "glm", "minimax_m2", "deepseek_v32", "deepseek_v4", "hy3",
                                 "minicpm5", "kimi_k3", "muse_glimmer", "lfm2"])
def test_call_grammar_holds_text_arguments_to_their_schema_in_any_order(fmt):
    """An XML argument's text is held to what the JSON grammar holds a string to (pattern - searched,
    as JSON Schema does -, lengths, const) and numbers to their range; the arguments may come in
    any order (the templates write them in the order given), each once, the required ones all."""
    f = ToolFormat(fmt, True)
    accepts = llguidance_matcher(Grammar.from_lark(call_grammar(f, BOOKING)))

    def call(**args):
        return write_calls(f, [{"name": "book", "arguments": args}])

    assert accepts(call(code="CDG", seats=2))
    assert accepts(call(seats=2, code="CDG"))  # (required ones in another order)
    assert accepts(call(note="aisle", seats=2, ref="x7y", code="CDG", kind="flight"))
    assert accepts(call(code="CDG", seats=2, ref="7"))
    for bad in (dict(code="cdg", seats=2), dict(code="CDGX", seats=2), dict(code="CDG", seats=10),
                dict(code="CDG", seats=0), dict(code="CDG", seats=2, note="a"), dict(code="CDG", seats=2, note="windows"),
                dict(code="CDG", seats=2, ref="xyz"), dict(code="CDG", seats=2, kind="train"), dict(code="CDG"),
                dict(seats=2)):
        assert not accepts(call(**bad)), bad
    # an argument written twice: the note's text (what a call with it has more) once more
    short, long = call(code="CDG", seats=2), call(code="CDG", seats=2, note="aisle")
    head = len(os.path.commonprefix([short, long]))
    tail = len(os.path.commonprefix([short[::-1], long[::-1]]))
    note = long[head:len(long) - tail]
    assert "aisle" in note and accepts(long)
    assert not accepts(long[:len(long) - tail] + note + long[len(long) - tail:])


def test_a_patterns_alternatives_are_searched_each_with_its_own_anchors():
    tool = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "s": {"type": "string", "pattern": "^ab|yz$"}}, "required": ["s"]}}}]
    f = ToolFormat("qwen3_coder", True)
    accepts = llguidance_matcher(Grammar.from_lark(call_grammar(f, tool)))
    assert [accepts(write_calls(f, [{"name": "f", "arguments": {"s": s}}])) for s in ("ab", "abc", "xyz", "xab", "yzx")] == \
        [True, True, True, False, False]


# each format's texts: valid ones, and ones just off (every one-character deletion of them, and
# characters swapped in or added, below, are tried too)
FORMAT_TEXTS = {
    "date": ["2024-01-31", "2024-02-29", "1999-12-01", "2024-02-30", "2024-04-31", "2024-04-30", "2024-13-01",
             "2024-00-10", "2024-1-01", "99999-01-01", "2024-01-01T"],
    "time": ["10:00:00Z", "23:59:60+05:30", "10:00:00.123z", "10:00:00-23:59", "24:00:00Z", "10:00:00",
             "10:00:00+24:00", "1:00:00Z", "10:60:00Z"],
    "date-time": ["2024-02-29T10:00:00Z", "2024-02-29t10:00:00.5+01:00", "2024-02-29 10:00:00Z", "2024-02-29T10:00Z",
                  "2024-06-31T10:00:00Z"],
    "duration": ["P1Y2M3DT4H5M6S", "P1W", "PT1H", "PT1M", "P1D", "P1M", "P1Y", "P1Y1D", "PT1H1S", "P12M4D", "P", "PT",
                 "P1H", "P1W1D", "P1DT", "P1.5D"],
    "email": ["a@b.c", "a.b@c", "x+y/z{}~@host-1.example", "a@[1.2.3.4]", "a..b@c", "a@-b.c", "a@b-.c", "a@[256.1.1.1]",
              '"a"@b', "a@b_c", "@b", ".a@b", "a@b.", "a b@c"],
    "hostname": ["a", "a.b", "a.b-c.d", "x" * 63, "x" * 64, "-a", "a-", "a..b", "a_b", "a.", "1.2.3.4"],
    "ipv4": ["1.2.3.4", "255.255.255.255", "0.0.0.0", "199.249.9.10", "256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5"],
    "ipv6": ["::", "::1", "1::", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "1::2:3:4:5:6:7", "fe80::a:b:c:d",
             "1:2:3::4:5:6", "1:2:3:4:5:6:7:8:9", "1::2::3", "::ffff:1.2.3.4", "12345::", "1:2:3:4:5:6:7::8", ":1::"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-426614174000",
             "123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400", "g23e4567-e89b-12d3-a456-426614174000"],
    "uri": ["http://a.b/c?d#e", "x:", "mailto:a@b", "http://[::1]:80/", "http://[v1.x]/", "urn:isbn:123",
            "http://u:p@h:8080/p/a/t/h?q=1&r=%20#f", "a:/b//c", "a://", "file:///tmp/x", "http://a b", "1http://a",
            "http://%zz", "http://[1.2.3.4]/", "http://[::1/", "h:?#"],
    "unknown": ["", "anything at all", "2024-01-01"],
}


def _texts_near(samples: list[str], seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    alphabet = sorted(set("".join(samples)) | set(" x:.-/@[]%ZT0"))
    out = set(samples)
    for s in samples:
        out.update(s[:i] + s[i + 1:] for i in range(len(s)))
        for _ in range(12):
            i = rng.randrange(len(s) + 1)
            c = rng.choice(alphabet)
            out.update((s[:i] + c + s[i + 1:], s[:i] + c + s[i:]))
    return sorted(out)


def _acceptor(grammar):
    """Whether llguidance accepts a text under grammar, byte by byte: one matcher, rolled back
    after each text (test_constrain.llguidance_matcher builds one a text)."""
    import llguidance

    from test_constrain import _ByteTokenizer

    m = llguidance.LLMatcher(llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer())), grammar._grammar,
                             log_level=0)

    def check(text: str) -> bool:
        data = list(text.encode())
        n = m.try_consume_tokens(data)
        ok = n == len(data) and m.is_accepting()
        m.rollback(n)
        return ok

    return check


@pytest.mark.parametrize("fmt", ["qwen3_coder", "kimi_k3"])
@pytest.mark.parametrize("name", sorted(FORMAT_TEXTS))
def test_xml_text_arguments_follow_a_format_as_the_json_grammar_holds_a_string_to_it(fmt, name):
    """A text argument with a JSON Schema format takes exactly the texts the JSON grammar takes as
    the string's content - alone, and with a pattern, lengths and an enum besides."""
    f = ToolFormat(fmt, True)
    schemas = [{"type": "string", "format": name}, {"type": "string", "format": name, "pattern": "[0-9]", "minLength": 3, "maxLength": 40},
               {"type": "string", "format": name, "enum": FORMAT_TEXTS[name][:3] + ["x"]}]
    texts = _texts_near(FORMAT_TEXTS[name], seed=len(name))
    for schema in schemas:
        as_json = _acceptor(Grammar.from_json_schema(schema))
        tool = [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"s": schema}, "required": ["s"]}}}]
        as_text = _acceptor(Grammar.from_lark(call_grammar(f, tool)))
        wrong = [t for t in texts if as_text(write_calls(f, [{"name": "f", "arguments": {"s": t}}]))
                 != as_json(json.dumps(t, ensure_ascii=False))]
        assert not wrong, (schema, wrong[:10])
        if schema.get("enum") is None:
            assert sum(as_json(json.dumps(t)) for t in texts) > (0 if "pattern" in schema else 2)  # (not all refused)


def test_an_unknown_format_is_named_as_the_json_grammar_names_it():
    tool = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "s": {"type": "string", "format": "uri-template"}}}}}]
    for fmt in ("qwen3_coder", "hermes"):
        with pytest.raises(GrammarError, match="Unknown format: uri-template"):
            Grammar.from_lark(call_grammar(ToolFormat(fmt, True), tool))


# ten arguments (more than common.MAX_ANY_ORDER): text, numbers and an array, two required
TEN = [{"type": "function", "function": {"name": "form", "parameters": {"type": "object", "properties": {
    **{f"t{i}": {"type": "string"} for i in range(4)}, **{f"n{i}": {"type": "integer"} for i in range(5)},
    "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["t0", "n4"]}}}]
TEN_ARGS = {**{f"t{i}": f"v{i}" for i in range(4)}, **{f"n{i}": i for i in range(5)}, "tags": ["a", "b"]}
XML_FORMATS = ["qwen3_coder", "seed_oss", "glm", "minimax_m2", "deepseek_v32", "deepseek_v4", "hy3", "minicpm5", "kimi_k3"]


class _Pairs:
    """Arguments as a call may write them, a key more than once (xml.write reads .items())."""

    def __init__(self, pairs):
        self.pairs = pairs

    def items(self):
        return self.pairs


def _twice(f, args: dict, key: str) -> str:
    """A call of `args` with argument `key` written a second time, at the end."""
    return write_calls(f, [{"name": "form", "arguments": _Pairs(list(args.items()) + [(key, args[key])])}])


@pytest.mark.parametrize("fmt", XML_FORMATS)
def test_any_number_of_xml_arguments_come_in_any_order_each_once(fmt):
    """Beyond the orders a grammar can list, an XML call's arguments still come in any order, each
    at most once (the grammar's ArgumentGuard), with the required ones before the call ends; and
    the grammar grows with the arguments, not with their orders."""
    import random

    f = ToolFormat(fmt, True)
    accepts = llguidance_matcher(Grammar.from_lark(call_grammar(f, TEN)))
    rng = random.Random(7)

    def call(keys):
        return write_calls(f, [{"name": "form", "arguments": {k: TEN_ARGS[k] for k in keys}}])

    keys = list(TEN_ARGS)
    for _ in range(6):
        rng.shuffle(keys)
        assert accepts(call(keys)), keys
        some = keys[:rng.randrange(len(keys))]
        assert accepts(call(some)) == ({"t0", "n4"} <= set(some)), some
    assert not accepts(call(["t0"])) and not accepts(call(["n4", "t1"]))
    for key in ("t0", "n2", "tags", "t3"):  # each argument once
        assert not accepts(_twice(f, {k: TEN_ARGS[k] for k in reversed(keys)}, key)), key
    def numbers(n):
        return [{"type": "function", "function": {"name": "form", "parameters": {"type": "object", "properties": {
            f"a{i}": {"type": "integer"} for i in range(n)}}}}]

    assert len(call_grammar(f, numbers(20))) < 2.2 * len(call_grammar(f, numbers(10)))


def test_argument_guard_reads_values_as_the_grammar_writes_them():
    """Text that looks like an argument's opening inside a value (raw text, or a JSON string) is the
    value's; arguments not listed (where the schema allows them) may come between listed ones
    but may not be listed ones again; parallel calls each have their own arguments; a JSON
    answer (call_or_json_grammar) is no call's."""
    from edgellm.tool_calls import call_or_json_grammar

    f = ToolFormat("qwen3_coder", True)
    accepts = llguidance_matcher(Grammar.from_lark(call_grammar(f, TEN)))
    tricky = dict(TEN_ARGS, t1="see <parameter=t0>\nx", tags=["\n</parameter>\n<parameter=t0>\n", "}"])
    assert accepts(write_calls(f, [{"name": "form", "arguments": tricky}]))
    assert not accepts(_twice(f, tricky, "t0"))
    loose = [{"type": "function", "function": {"name": "form", "parameters": dict(TEN[0]["function"]["parameters"],
                                                                                     additionalProperties=True)}}]
    accepts = llguidance_matcher(Grammar.from_lark(call_grammar(f, loose)))
    mixed = {"t0": "a", "extra": "b", "n4": 1, "more": "c"}
    assert accepts(write_calls(f, [{"name": "form", "arguments": mixed}]))
    assert not accepts(_twice(f, mixed, "t0"))
    assert not accepts(write_calls(f, [{"name": "form", "arguments": {"extra": "b"}}]))  # (t0, n4 required)
    several = llguidance_matcher(Grammar.from_lark(call_grammar(f, TEN, parallel=True)))
    one = write_calls(f, [{"name": "form", "arguments": TEN_ARGS}])
    assert several(one + "\n" + one)
    assert not several(one + "\n" + _twice(f, TEN_ARGS, "n1"))
    either = llguidance_matcher(Grammar.from_lark(call_or_json_grammar(f, TEN, {"type": "object"})))
    assert either('{"note": "<tool_call>\\n<function=form>\\n"}') and either(one)
    assert not either(_twice(f, TEN_ARGS, "n1"))
    # keys holding what ends a key (an opening might begin another's): the schema's order, no guard
    odd = [{"type": "function", "function": {"name": "form", "parameters": {"type": "object", "properties": {
        f"a>{i}": {"type": "integer"} for i in range(8)}}}}]
    assert Grammar.from_lark(call_grammar(f, odd)).guard is None
    assert Grammar.from_lark(call_grammar(f, TEN)).guard is not None


def test_argument_guard_masks_tokens_in_a_real_vocabulary():
    """Token by token in Qwen3.5's vocabulary: the mask and allows() agree, an argument's opening
    written before is out of the mask (whole or begun), the call's end is out while a required
    argument is missing, and rolling back restores what was allowed."""
    import numpy as np

    from edgellm.constrain import allowed
    from edgellm.gguf_file import GGUFFile
    from edgellm.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(dict(GGUFFile(models_dir() / "ggml-vocab-qwen35.gguf").metadata))
    f = ToolFormat("qwen3_coder", True)
    grammar = Grammar.from_lark(call_grammar(f, TEN))
    c = grammar.constraint(tok)
    text = write_calls(f, [{"name": "form", "arguments": {"n2": 2, "t0": "hi"}}])
    body = text[:text.index("</function>")]
    ids = tok.encode(body, add_bos=False)
    assert tok.decode(ids) == body
    for t in ids:
        assert c.allows(t) and allowed(c.compute_mask(), t)
        c.accept(t)
    mask = c.compute_mask()
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little", count=tok.n_vocab).view(bool)
    again = tok.encode("<parameter=t0>\n", add_bos=False)
    other = tok.encode("<parameter=t1>\n", add_bos=False)
    end = tok.encode("</function>", add_bos=False)
    assert bits[other[0]] and c.allows(other[0])  # ("<": another argument, or the end)
    assert c.valid_prefix(other) == len(other) and c.valid_prefix(again) < len(again)
    assert c.valid_prefix(end) < len(end)  # (n4 is missing)
    sample = np.flatnonzero(bits)
    assert all(c.allows(int(t)) for t in sample)
    for t in other[:-1]:
        c.accept(t)
    mask2 = c.compute_mask()
    bits2 = np.unpackbits(mask2.view(np.uint8), bitorder="little", count=tok.n_vocab).view(bool)
    assert all(c.allows(int(t)) == bool(bits2[t]) for t in range(tok.n_vocab) if c._m.validate_tokens([t]))
    c.rollback(len(other) - 1)
    assert np.array_equal(c.compute_mask(), mask)


def test_lfm2_calls_are_read_as_python_literals_never_run():
    f = ToolFormat("lfm2", True)
    text = "<|tool_call_start|>[set_alarm(hour=7, label='wake \\'up\\'', days=[\"mon\", 'tue'], loud=true, note=None)]<|tool_call_end|>"
    (call,) = parse(f, text)[1]
    assert json.loads(call["function"]["arguments"]) == {"hour": 7, "label": "wake 'up'", "days": ["mon", "tue"],
                                                         "loud": True, "note": None}
    for bad in ("[set_alarm(__import__('os').getcwd())]", "[set_alarm(hour=__import__('os').getcwd())]", "[set_alarm(7)]",
                "set_alarm(hour=7)", "[os.system(hour=7)]", "[" * 10000):
        text = f"<|tool_call_start|>{bad}<|tool_call_end|>"
        assert parse(f, text) == (text, [])
    accepts = llguidance_matcher(Grammar.from_lark(call_grammar(f, ALARM)))
    assert accepts('<|tool_call_start|>[set_alarm(hour=7, days=["mon"])]<|tool_call_end|>')
    assert accepts('<|tool_call_start|>[set_alarm(hour=7)]<|tool_call_end|>')
    assert not accepts('<|tool_call_start|>[set_alarm(label="x")]<|tool_call_end|>')  # hour is required
    assert not accepts('<|tool_call_start|>[set_alarm(hour=7, hour=8)]<|tool_call_end|>')
    loose = llguidance_matcher(Grammar.from_lark(call_grammar(f, [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}}}])))
    assert all(loose(f"<|tool_call_start|>[f({a})]<|tool_call_end|>") for a in ("", "a=1", 'b="x"', 'a=1, b="x"'))
    assert not loose('<|tool_call_start|>[f(, b="x")]<|tool_call_end|>')
    # the reasoning before a call goes back as the template's `thinking`
    from edgellm.chat import ChatTemplate
    from edgellm.tool_calls import prepare_turn

    call = {"id": "c1", "type": "function", "function": {"name": "set_alarm", "arguments": '{"hour": 7}'}}
    history = [{"role": "user", "content": "Wake me at 7"},
               {"role": "assistant", "content": "", "reasoning_content": "An alarm.", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "set"}]
    prompt = prepare_turn(ChatTemplate(template("LFM2.5-8B-A1B")), history, ALARM).prompt
    assert "<think>An alarm.</think><|tool_call_start|>[set_alarm(hour=7)]<|tool_call_end|>" in prompt


@pytest.mark.parametrize("fmt, text", [
    ("deepseek_v4", '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="true">42</｜DSML｜parameter>\n'
                    '<｜DSML｜parameter name="b" string="false">42</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>'),
    ("kimi_k3", '<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|open|>argument key="a" type="string"<|sep|>42'
                '<|close|>argument<|sep|><|open|>argument key="b" type="number"<|sep|>42<|close|>argument<|sep|><|close|>call<|sep|>'
                '<|close|>tools<|sep|>'),
])
def test_a_formats_own_type_attribute_says_which_values_are_text(fmt, text):
    assert json.loads(parse(ToolFormat(fmt, True), text)[1][0]["function"]["arguments"]) == {"a": "42", "b": 42}  # no tools


@pytest.mark.parametrize("fmt", ["gigachat_v3", "gigachat_v31"])
def test_gigachat_writes_one_call_even_when_several_are_allowed(fmt):
    f = ToolFormat(fmt, True)
    several = llguidance_matcher(Grammar.from_lark(call_grammar(f, TOOLS, parallel=True)))
    assert several(FORCED[fmt])
    assert not several(FORCED[fmt] + '\n{"name": "get_time", "arguments": {"zone": "CET"}}')


def test_minicpm5_text_in_cdata_is_read_as_written():
    text = '<function name="set_alarm"><param name="hour">7</param><param name="label"><![CDATA[a <b> & c\n]]></param></function>'
    call = parse(ToolFormat("minicpm5", True), text, ALARM)[1][0]
    assert json.loads(call["function"]["arguments"]) == {"hour": 7, "label": "a <b> & c\n"}


def test_gemma4_values_in_its_own_notation():
    f = ToolFormat("gemma4", True)
    # as the template writes them: the names sorted, text in <|"|>, the rest bare
    text = ('<|tool_call>call:set_alarm{days:[<|"|>mon<|"|>,<|"|>tue<|"|>],hour:7,label:<|"|>42, "quoted"<|"|>,'
            'opts:{loud:true,note:null}}<tool_call|>')
    calls = parse(f, text, ALARM)[1]
    assert json.loads(calls[0]["function"]["arguments"]) == {"days": ["mon", "tue"], "hour": 7, "label": '42, "quoted"',
                                                             "opts": {"loud": True, "note": None}}
    for bad in ('<|tool_call>call:set_alarm{hour:7<tool_call|>', '<|tool_call>call:set_alarm{hour:seven}<tool_call|>',
                '<|tool_call>call:set_alarm{hour:7}'):
        assert parse(f, bad) == (bad, [])
    accepts = llguidance_matcher(Grammar.from_lark(call_grammar(f, ALARM)))
    assert accepts('<|tool_call>call:set_alarm{days:[<|"|>mon<|"|>],hour:7}<tool_call|>')
    assert accepts(write_calls(f, [{"name": "set_alarm", "arguments": {"label": "x", "hour": 7}}]))  # (sorted)
    assert not accepts('<|tool_call>call:set_alarm{hour:<|"|>7<|"|>}<tool_call|>')  # an integer
    assert not accepts('<|tool_call>call:set_alarm{label:<|"|>x<|"|>}<tool_call|>')  # hour is required
    assert not accepts('<|tool_call>call:set_alarm{label:<|"|>x<|"|>,hour:7}<tool_call|>')  # not in name order


def test_gemma4_markers_are_text_in_gemma4s_vocabulary():
    """The engine's text holds Gemma 4's call and reasoning markers (user-defined tokens there, not
    control ones it would leave out), so its reply parses as written."""
    from edgellm.gguf_file import GGUFFile
    from edgellm.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(dict(GGUFFile(models_dir() / "ggml-vocab-gemma-4.gguf").metadata))
    said = '<|channel>thought\nEasy.<channel|>' + WRITTEN["gemma4"]
    ids = tok.encode(said, add_bos=False, special=True)
    assert tok.decode(ids) == said  # (control tokens would be left out of the text)
    assert all(len(tok.encode(m, add_bos=False, special=True)) == 1 for m in ("<|channel>", "<channel|>", "<|tool_call>",
                                                                              "<tool_call|>", '<|"|>'))
    assert parse(ToolFormat("gemma4", True), tok.decode(ids).split("<channel|>")[1])[1][0]["function"]["name"] == "get_weather"


def test_command_r7b_answer_is_the_text_of_its_response():
    f = ToolFormat("command_r7b", True)
    assert parse(f, "<|START_RESPONSE|>It is sunny.<|END_RESPONSE|>") == ("It is sunny.", [])


@pytest.mark.parametrize("name", ["ibm-granite-granite-3.3-2B-Instruct", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
                                  "deepseek-ai-DeepSeek-V3.1", "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
                                  "Qwen3-Coder", "GLM-4.6", "Kimi-K2-Instruct", "ByteDance-Seed-OSS",
                                  "openai-gpt-oss-120b", "Apertus-8B-Instruct", "NVIDIA-Nemotron-Nano-v2",
                                  "Apriel-1.6-15b-Thinker-fixed", "MiniMax-M1", "MiniMax-M2", "LFM2.5-8B-A1B",
                                  "fireworks-ai-llama-3-firefunction-v2", "deepseek-ai-DeepSeek-V3.2", "deepseek-ai-DeepSeek-V4",
                                  "tencent-Hy3", "GigaChat3-10B-A1.8B", "GigaChat3.1-10B-A1.8B", "upstage-Solar-Open-100B",
                                  "google-gemma-4-31B-it", "openbmb-MiniCPM5-1B", "Kimi-K3", "muse-glimmer",
                                  "HuggingFaceTB-SmolLM3-3B"])
def test_a_recognised_format_gets_no_generic_how_to_call_line(name):
    from edgellm.chat import ChatTemplate
    from edgellm.tool_calls import prepare_turn

    t = ChatTemplate(template(name), bos_token="<s>", eos_token="</s>")
    turn = prepare_turn(t, [{"role": "user", "content": "Weather in Paris?"}], TOOLS, "required")
    assert turn.fmt.name != "generic" and '{"tool_call"' not in turn.prompt and '"response"' not in turn.prompt
    # how to call, in the format's own form, only where the template lists no tools (and so teaches no calls)
    assert ("To call a tool" in turn.prompt) == (not t.tool_caps.supports_tools)
    assert "get_weather" in turn.prompt  # the tools are listed


GPT_OSS = ToolFormat("gpt_oss", True)


def test_gpt_oss_messages_are_read_by_their_channel():
    from edgellm.tool_calls import ChatTurn

    turn = ChatTurn("", GPT_OSS, None, False, True, tuple(TOOLS))
    said = ("<|channel|>analysis<|message|>The user wants weather.<|end|><|start|>assistant<|channel|>commentary<|message|>"
            "Checking.<|end|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{\"zone\": \"CET\"}")
    msg, finish = turn.message(said, "stop")  # the call's recipient in the role header, as the template writes it
    assert (msg["reasoning_content"], msg["content"], finish) == ("The user wants weather.", "Checking.", "tool_calls")
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]] == [("get_time", '{"zone": "CET"}')]
    answer = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny."
    assert turn.message(answer, "stop") == ({"role": "assistant", "content": "It is sunny.", "reasoning_content": "Easy."},
                                            "stop")
    no_tools = ChatTurn("", GPT_OSS, None, False, False)  # without tools the channels are still read, calls dropped
    assert no_tools.message(answer, "stop")[0]["content"] == "It is sunny."
    assert no_tools.message(said, "stop")[0] == {"role": "assistant", "content": "Checking.",
                                                 "reasoning_content": "The user wants weather."}
    builtin = "<|channel|>analysis<|message|>Search.<|end|><|start|>assistant<|channel|>commentary to=browser.search json<|message|>{}"
    assert parse(GPT_OSS, builtin) == ("", [])  # a built-in tool's call is no call of the request's tools
    # not harmony, or a header that never ends: content as written
    for text in ("Sunny <|channel|> and warm", "<|channel|>final" + "x" * 300, "<|channel|>analysis<|message|>hmm"):
        assert parse(GPT_OSS, text)[1] == []
    assert parse(GPT_OSS, "Sunny <|channel|> and warm") == ("Sunny <|channel|> and warm", [])
    assert turn.message("<|channel|>analysis<|message|>still thinking", "length") == (
        {"role": "assistant", "content": "", "reasoning_content": "still thinking"}, "length")
    bad = '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"zone": CET}'
    assert parse(GPT_OSS, bad) == (bad, [])  # arguments that are not JSON: no call
    accepts = llguidance_matcher(Grammar.from_lark(call_grammar(GPT_OSS, TOOLS)))
    assert accepts(WRITTEN["gpt_oss"])  # the required call may come after an analysis
    assert not accepts(WRITTEN["gpt_oss"].replace("Let me check.", "<|start|>"))


def test_gpt_oss_json_answer_is_its_final_message():
    from edgellm.tool_calls import answer_grammar, call_or_json_grammar

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
    answer = llguidance_matcher(Grammar.from_lark(answer_grammar(GPT_OSS, schema)))
    final = '<|channel|>final<|message|>{"a": 1}'
    assert answer(final) and answer("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant" + final)
    assert not answer('{"a": 1}') and not answer('<|channel|>final<|message|>{"a": "x"}')
    either = llguidance_matcher(Grammar.from_lark(call_or_json_grammar(GPT_OSS, TOOLS, schema)))
    assert either(final) and either(FORCED["gpt_oss"]) and not either("It is sunny.")
    assert answer_grammar(ToolFormat("hermes", True), schema) is None  # the answer is the JSON alone
    assert parse(GPT_OSS, final) == ('{"a": 1}', [])


def test_gpt_oss_history_renders_as_its_template_writes_it():
    """A reply read back (reasoning, call) and its tool's result, rendered for the next turn: the
    call's analysis, the call to functions.NAME and the result from it, as the template writes them."""
    from edgellm.chat import ChatTemplate
    from edgellm.tool_calls import ChatTurn, prepare_turn

    t = ChatTemplate(template("openai-gpt-oss-120b"))
    assert "<|end|>" not in t.stop_strings  # it ends one message of the reply, not the turn
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    turn = prepare_turn(t, ask, TOOLS, "required")
    assert turn.fmt == GPT_OSS and turn.prompt.endswith("<|start|>assistant") and "type get_weather" in turn.prompt
    msg, _ = turn.message(WRITTEN["gpt_oss"], "stop")
    history = ask + [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "Sunny"}]
    prompt = prepare_turn(t, history, TOOLS).prompt
    assert prompt.endswith("<|start|>user<|message|>Weather in Paris?<|end|>"
                           "<|start|>assistant<|channel|>analysis<|message|>Let me check.<|end|>"
                           '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
                           '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"Sunny"<|end|>'
                           "<|start|>assistant")


def test_muse_glimmer_messages_are_read_by_their_recipient_and_its_history_renders_back():
    """Muse Glimmer (llama.cpp's common/parsers/muse-glimmer.cpp): to=self is reasoning, to=user (or
    no recipient) the answer, to=NAME an ATEM call; a call read back, with its result, renders as
    the template writes it."""
    from edgellm.chat import ChatTemplate
    from edgellm.tool_calls import prepare_turn

    t = ChatTemplate(template("muse-glimmer"))
    assert "<|eot|>" in t.stop_strings and "<|eom|>" not in t.stop_strings  # (<|eom|> ends one message)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    turn = prepare_turn(t, ask, TOOLS, "required")
    assert turn.fmt.name == "muse_glimmer" and turn.prompt.endswith("<|start|>assistant")
    msg, finish = turn.message(WRITTEN["muse_glimmer"], "stop")
    assert (msg["reasoning_content"], msg["content"], finish) == ("Let me check.", None, "tool_calls")
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    answer = " to=self<|message|>Easy.<|eom|><|start|>assistant to=user<|message|>It is sunny."
    for tools in (TOOLS, None):
        plain = prepare_turn(t, ask, tools).message(answer, "stop")[0]
        assert plain == {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Easy."}
    assert prepare_turn(t, ask).message(WRITTEN["muse_glimmer"], "stop")[0] == {  # no tools: no call
        "role": "assistant", "content": "", "reasoning_content": "Let me check."}
    history = ask + [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "Sunny"}]
    assert prepare_turn(t, history, TOOLS).prompt.endswith(
        "<|start|>user<|message|>Weather in Paris?<|eot|><|start|>assistant to=self<|message|>Let me check.<|eom|>"
        "<|start|>assistant to=get_weather<|message|>" + WRITTEN["muse_glimmer"].split("<|message|>")[-1] +
        '<|eot|><|start|>tool get_weather<|message|><tool_output name="get_weather">\nSunny\n</tool_output><|eot|>'
        "<|start|>assistant")


def test_smollm3_without_tools_in_its_template_is_told_the_hermes_form():
    """llama.cpp's copy of SmolLM3's template lists no tools and renders no calls; SmolLM3 writes
    Hermes calls (its own template's xml_tools): the tools and that form go in the system message,
    a past call as the model writes it, and the reply is read as Hermes'."""
    from edgellm.chat import ChatTemplate
    from edgellm.tool_calls import prepare_turn

    t = ChatTemplate(template("HuggingFaceTB-SmolLM3-3B"))
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    turn = prepare_turn(t, ask, TOOLS)
    assert turn.fmt == ToolFormat("hermes", False) and '"name": "get_weather"' in turn.prompt
    assert "To call a tool, write the call in this form" in turn.prompt and "<tool_call>" in turn.prompt
    msg, finish = turn.message("<think>\nParis.\n</think>\n" + FORCED["hermes"], "stop")
    assert (msg["reasoning_content"], finish, msg["tool_calls"][0]["function"]["name"]) == ("Paris.", "tool_calls", "get_weather")
    history = ask + [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "Sunny"}]
    assert FORCED["hermes"] in prepare_turn(t, history, TOOLS).prompt


def test_command_r7b_thinking_is_reasoning_content():
    from edgellm.chat import ChatTemplate
    from edgellm.tool_calls import ChatTurn, prepare_turn

    cr = ToolFormat("command_r7b", True)
    acting, _ = ChatTurn("", cr, None, False, True, tuple(TOOLS)).message(WRITTEN["command_r7b"], "stop")
    assert acting["reasoning_content"] == "Let me check." and acting["content"] is None
    assert json.loads(acting["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    answer = "<|START_THINKING|>Easy.<|END_THINKING|><|START_RESPONSE|>It is sunny.<|END_RESPONSE|>"
    for tools in (True, False):
        msg, _ = ChatTurn("", cr, None, False, tools, tuple(TOOLS)).message(answer, "stop")
        assert msg == {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Easy."}
    opened = ChatTurn("", cr, None, True, False).message("Easy.<|END_THINKING|><|START_TEXT|>Sunny.<|END_TEXT|>", "stop")[0]
    assert (opened["reasoning_content"], opened["content"]) == ("Easy.", "Sunny.")  # Cohere2 MoE's answer markers
    # the reasoning goes back in as the template writes it before a call
    t = ChatTemplate(template("CohereForAI-c4ai-command-r7b-12-2024-tool_use"))
    turn = prepare_turn(t, [{"role": "user", "content": "Weather?"}], TOOLS)
    assert not turn.thinking  # the prompt ends with an empty thinking block
    history = [{"role": "user", "content": "Weather?"}, acting,
               {"role": "tool", "tool_call_id": acting["tool_calls"][0]["id"], "content": "Sunny"}]
    assert "<|START_THINKING|>Let me check.<|END_THINKING|><|START_ACTION|>" in prepare_turn(t, history, TOOLS).prompt


@pytest.mark.parametrize("name, reply", [
    ("Apertus-8B-Instruct", "<|inner_prefix|>Easy.<|inner_suffix|>It is sunny."),
    ("Apriel-1.6-15b-Thinker-fixed", "Easy.\n[BEGIN FINAL RESPONSE]\nIt is sunny.[END FINAL RESPONSE]"),  # the prompt opened it
    ("tencent-Hy3", "<think:opensource>Easy.</think:opensource>It is sunny."),
    ("upstage-Solar-Open-100B", "<|think|>Easy.<|end|><|begin|>assistant<|content|>It is sunny."),
    ("google-gemma-4-31B-it", "<|channel>thought\nEasy.<channel|>It is sunny."),
    ("Kimi-K3", "Easy.<|close|>think<|sep|><|open|>response<|sep|>It is sunny.<|close|>response<|sep|><|close|>message<|sep|>"),
])
def test_a_formats_own_reasoning_markers(name, reply):
    from edgellm.chat import ChatTemplate
    from edgellm.tool_calls import prepare_turn

    t = ChatTemplate(template(name))
    if name == "upstage-Solar-Open-100B":
        assert "<|end|>" not in t.stop_strings  # it ends the reasoning, not the turn
    for tools in (TOOLS, None):
        turn = prepare_turn(t, [{"role": "user", "content": "Weather?"}], tools)
        assert turn.message(reply, "stop")[0] == {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Easy."}


def test_reasoning_is_split_off():
    assert split_reasoning("<think>\nhmm, Paris\n</think>\n\nIt is sunny.") == ("hmm, Paris", "It is sunny.")
    assert split_reasoning("hmm</think>Sunny", started=True) == ("hmm", "Sunny")
    assert split_reasoning("Sunny") == (None, "Sunny")
    assert split_reasoning("<think>still going", False) == ("still going", "")


# --------------------------------------------------------------------------------------------
# on a real model: three template families


@pytest.fixture(scope="module")
def llms(smollm2_path):
    import edgellm

    return {name: edgellm.LLM(smollm2_path, n_ctx=1024, chat_template=template(name) if name != "own" else None)
            for name in FAMILIES}


# Hermes/Qwen <tool_call>, Llama 3.1 JSON, Mistral [TOOL_CALLS]name[ARGS], and SmolLM2's own
# ChatML template, which knows no tools (the generic format, tools described in the system message)
FAMILIES = ["Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct", "Mistral-Small-3.2-24B-Instruct-2506", "own"]


@pytest.mark.real
@pytest.mark.parametrize("family", FAMILIES)
def test_required_tool_call_then_its_result_continues_the_conversation(llms, family):
    llm = llms[family]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    out = llm.create_chat_completion(messages, tools=TOOLS, tool_choice="required", max_tokens=80, seed=0)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    calls = choice["message"]["tool_calls"]
    assert len(calls) == 1 and calls[0]["function"]["name"] in ("get_weather", "get_time")
    args = json.loads(calls[0]["function"]["arguments"])
    assert set(args) <= {"city", "unit", "zone"}
    named = llm.chat_message(messages, tools=TOOLS, max_tokens=80, seed=1,
                             tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named["tool_calls"][0]["function"]["name"] == "get_weather"
    assert "city" in json.loads(named["tool_calls"][0]["function"]["arguments"])

    # the call (arguments as OpenAI's JSON text, an id Mistral accepts) and its result go back in
    call = {**calls[0], "id": "abc123DEF"}
    messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": "abc123DEF", "name": call["function"]["name"],
                  "content": '{"temperature": 18}'}]
    prompt = llm.template.render(prepare_messages(messages, detect_format(llm.template.source)), tools=TOOLS)
    assert "temperature" in prompt.split("What is the weather in Paris?")[1]  # the result is in the prompt
    assert call["function"]["name"] in prompt.split("What is the weather in Paris?")[1]
    replies = [llm.chat_message(messages, tools=TOOLS, tool_choice="none", max_tokens=24, seed=seed)
               for seed in range(2, 5)]
    assert all(r["role"] == "assistant" and "tool_calls" not in r for r in replies)
    assert any(r["content"] for r in replies)  # (a 135M model may also end its turn at once)


@pytest.mark.real
def test_gpt_oss_template_on_a_real_model_a_json_answer_and_a_required_call(smollm2_path):
    """SmolLM2 with gpt-oss's template: the grammar writes its channels, the reply reads back."""
    import edgellm

    llm = edgellm.LLM(smollm2_path, n_ctx=2048, chat_template=template("openai-gpt-oss-120b"))
    ask = [{"role": "user", "content": "Give me a number."}]
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"schema": schema}}
    raw = llm.chat(ask, max_tokens=200, seed=0, response_format=fmt)
    assert "<|channel|>final<|message|>{" in raw  # the answer is the final message
    assert "<|channel|>final<|message|>{" in llm.chat_batch([ask], max_tokens=200, seed=0, response_format=fmt)[0]
    assert set(json.loads(llm.chat_message(ask, max_tokens=200, seed=0, response_format=fmt)["content"])) == {"n"}
    calls = [llm.create_chat_completion(ask, tools=TOOLS, tool_choice="required", max_tokens=120, seed=s)["choices"][0]
             for s in range(3)]
    done = [c for c in calls if c["finish_reason"] == "tool_calls"]  # (or a 135M model thinks until max_tokens)
    assert done and all(c["message"]["tool_calls"][0]["function"]["name"] in ("get_weather", "get_time") for c in done)


TRIP = [{"type": "function", "function": {"name": "book_trip", "parameters": {"type": "object", "properties": {
    "origin": {"type": "string", "maxLength": 16}, "destination": {"type": "string", "maxLength": 16},
    "date": {"type": "string", "format": "date"}, "return_date": {"type": "string", "format": "date"},
    "adults": {"type": "integer", "minimum": 1, "maximum": 9}, "children": {"type": "integer", "minimum": 0, "maximum": 9},
    "cabin": {"type": "string", "enum": ["economy", "business"]}, "direct_only": {"type": "boolean"},
    "contact": {"type": "string", "format": "email", "maxLength": 40}, "notes": {"type": "string", "maxLength": 20}},
    "required": ["origin", "destination", "date", "adults"]}}}]


@pytest.mark.real
def test_a_required_ten_argument_xml_call_on_a_real_model(smollm2_path):
    """SmolLM2 with Qwen3-Coder's template, a tool of ten arguments (more than a grammar can list
    the orders of): every call it is made to write has the required arguments, each argument
    once, dates and emails as their formats say."""
    import re

    import edgellm
    from edgellm.tool_calls.string_formats import STRING_FORMATS

    llm = edgellm.LLM(smollm2_path, n_ctx=2048, chat_template=template("Qwen3-Coder"))
    ask = [{"role": "user", "content": "Book a trip from Lisbon to Oslo on 14 March 2026 for two adults."}]
    f = ToolFormat("qwen3_coder", True)
    for seed in range(3):
        raw = llm.chat(ask, tools=TRIP, tool_choice="required", max_tokens=400, seed=seed, temperature=1.0)
        (call,) = parse(f, raw, TRIP)[1]
        args = json.loads(call["function"]["arguments"])
        assert {"origin", "destination", "date", "adults"} <= set(args), raw
        assert all(raw.count(f"<parameter={key}>") == 1 for key in args), raw
        for key, fmt in (("date", "date"), ("return_date", "date"), ("contact", "email")):
            assert key not in args or re.fullmatch(STRING_FORMATS[fmt], args[key]), raw


@pytest.mark.real
def test_bad_tool_requests_are_clear_errors(llms):
    llm = llms["Qwen-Qwen2.5-7B-Instruct"]
    msgs = [{"role": "user", "content": "hi"}]
    for kw, match in ((dict(tools=[{"type": "function"}]), "tools\\[0\\]"),
                      (dict(tools="get_weather"), "non-empty list"),
                      (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice must be"),
                      (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "'nope'"),
                      (dict(tool_choice="required"), "needs tools")):
        with pytest.raises(TemplateError, match=match):
            llm.chat_message(msgs, **kw)
    bad_args = [{"role": "assistant", "tool_calls": [{"id": "x", "type": "function",
                                                      "function": {"name": "f", "arguments": "{not json"}}]}]
    with pytest.raises(TemplateError, match="arguments are not JSON"):
        llm.chat_message(msgs + bad_args + msgs, tools=TOOLS)
