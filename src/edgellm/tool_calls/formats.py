"""The one table of tool-call formats (FORMATS): how each is recognised in a chat template's
text, the family module that writes, forces and reads its calls, and its reasoning and answer
markers. Detection goes down the table in order; the first format whose test passes is the
template's (generic, last, takes any)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from . import gemma4, harmony, json_calls, marked, muse, pythonic, xml
from .common import GENERIC, THINK_CLOSE, THINK_OPEN, ToolFormat, json_rule


@dataclass(frozen=True)
class Format:
    family: ModuleType  # write(name, calls), grammar(name, tools, parallel), markers(name), and
    # read(name, scan, tools): the reader of a reply's body (scan.py)
    detect: Callable[[str], bool]  # the template's source -> whether it is this format's
    reasoning: tuple[str, str] = (THINK_OPEN, THINK_CLOSE)  # the markers around its reasoning
    answer_marks: tuple[str, ...] = ()  # markers around the answer, dropped from the content
    # the template writes an assistant's reasoning from its `thinking` (as llama.cpp passes
    # reasoning_content to it): None, or whether a message with calls then loses its content
    thinking_field: bool | None = None
    messages: bool = False  # a reply is messages (its family reads them, its reasoning too, tools or not)


def _has(*markers: str) -> Callable[[str], bool]:
    return lambda src: all(m in src for m in markers)


def _smollm3(src: str) -> bool:
    """SmolLM3's template as llama.cpp's copy has it (Unsloth's edit): it lists no tools and
    renders no calls (llama.cpp reads its replies as content only), while the model, taught by its
    own template's xml_tools, writes Hermes' <tool_call> JSON: read as Hermes, the tools and the
    form of a call described in the system message."""
    return "SmolLM" in src and "/no_think" in src and "<tool_call>" not in src


_JSON = json_calls
FORMATS: dict[str, Format] = {
    "gpt_oss": Format(harmony, _has(harmony.CHANNEL), thinking_field=True, messages=True),
    "muse_glimmer": Format(muse, _has("<atem:function_calls>", muse.EOM), messages=True),
    "hy3": Format(xml, _has("<tool_sep{}>", xml.HY), reasoning=(f"<think{xml.HY}>", f"</think{xml.HY}>")),
    "deepseek_v32": Format(xml, _has(xml.DSML, "function_calls>")),
    "deepseek_v4": Format(xml, _has(xml.DSML)),
    "deepseek_r1": Format(_JSON, _has(json_calls.DS_CALLS_BEGIN, "```json")),
    "deepseek_v3": Format(_JSON, _has(json_calls.DS_CALLS_BEGIN)),
    "kimi_k2": Format(_JSON, _has(json_calls.KIMI[0])),
    # (its prompt opens the think section, or the response one)
    "kimi_k3": Format(xml, _has("<|open|>", "<|close|>", "<|end_of_msg|>"), reasoning=("<|open|>think<|sep|>", "<|close|>think<|sep|>"),
                      answer_marks=("<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>",
                                    "<|end_of_msg|>")),
    "command_r7b": Format(marked, _has("<|START_ACTION|>"), reasoning=("<|START_THINKING|>", "<|END_THINKING|>"),
                          answer_marks=("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>")),
    "gemma4": Format(gemma4, _has(gemma4.OPEN), reasoning=("<|channel>thought", "<channel|>")),
    "lfm2": Format(pythonic, lambda src: any(m in src for m in (pythonic.OPEN, "<|tool_list_start|>", "List of tools: [")),
                   thinking_field=False),
    "command_r_plus": Format(marked, _has("<|START_OF_TURN_TOKEN|>", "Action:", "```json")),
    "firefunction_v2": Format(marked, _has("functools[")),
    "solar_open": Format(_JSON, _has(json_calls.SOLAR[1], "<|think|>"), reasoning=("<|think|>", "<|end|>"),
                         answer_marks=("<|begin|>assistant", "<|content|>", "<|end|>")),
    "gigachat_v31": Format(marked, _has("<|role_sep|>", "<|message_sep|>", "<|function_call|>")),
    "gigachat_v3": Format(marked, _has("<|role_sep|>", "<|message_sep|>")),
    "apertus": Format(marked, _has("<|tools_prefix|>"), reasoning=("<|inner_prefix|>", "<|inner_suffix|>")),
    "nemotron_v2": Format(marked, _has("<TOOLCALL>")),
    # (Apriel 1.6's prompt opens its reasoning)
    "apriel": Format(marked, _has("<tool_calls>["), reasoning=("Here are my reasoning steps:", "[BEGIN FINAL RESPONSE]"),
                     answer_marks=("[END FINAL RESPONSE]",)),
    "minimax_m1": Format(marked, _has("<tool_calls>")),
    "granite": Format(marked, _has("<|tool_call|>")),
    "minimax_m2": Format(xml, _has("<minimax:tool_call>")),
    "minicpm5": Format(xml, _has('<function name="', '<param name="')),
    "seed_oss": Format(xml, _has("<seed:tool_call>")),
    "glm": Format(xml, _has("<tool_call>", "<arg_key>")),
    "qwen3_coder": Format(xml, _has("<tool_call>", "<function=", "<parameter=")),
    "hermes": Format(_JSON, lambda src: "<tool_call>" in src or _smollm3(src)),
    "mistral_args": Format(_JSON, _has("[TOOL_CALLS]", "[ARGS]")),
    "mistral": Format(marked, _has("[TOOL_CALLS]")),
    "functionary": Format(_JSON, _has(">>>")),
    "function_tag": Format(_JSON, _has("<function=")),
    "llama3": Format(_JSON, lambda src: "<|start_header_id|>" in src and ("tools" in src or json_calls.PYTHON_TAG in src)),
    "generic": Format(_JSON, lambda src: True),
}


def detect_format(template_source: str) -> ToolFormat:
    src = template_source or ""
    name = next(n for n, f in FORMATS.items() if f.detect(src))
    return GENERIC if name == "generic" else ToolFormat(name, not _smollm3(src))


def _spec(fmt: ToolFormat | None) -> Format:
    return FORMATS.get(fmt.name if fmt is not None else "generic", FORMATS["generic"])


def reasoning_tags(fmt: ToolFormat | None) -> tuple[str, str]:
    return _spec(fmt).reasoning


def answer_marks(fmt: ToolFormat | None) -> tuple[str, ...]:
    return _spec(fmt).answer_marks


def thinking_field(fmt: ToolFormat) -> bool | None:
    return _spec(fmt).thinking_field


def preserved_markers(fmt: ToolFormat | None, calls: bool) -> tuple[str, ...]:
    """The texts a reply in format `fmt` is read by, which must stay in the generated text where
    the vocabulary makes them control tokens (llama.cpp's preserved tokens): its reasoning tags and
    answer marks, and, where the request has tools (`calls`), the markers of its calls (gpt-oss's
    message markers always: every reply is read by them). A text may hold more than one marker and
    text between them (Tokenizer.preserved_ids finds the control tokens in it)."""
    spec = _spec(fmt)
    found = spec.reasoning + spec.answer_marks
    if fmt is not None and (calls or spec.messages):
        found += spec.family.markers(fmt.name)
    return tuple(dict.fromkeys(found))


def always_read(fmt: ToolFormat | None) -> bool:
    """A reply in the format is read by its family with or without tools (its messages)."""
    return _spec(fmt).messages


def reader(fmt: ToolFormat | None, tools: list[dict] | None):
    """The reader of a reply's body in format fmt, for a Scan (tools: the request's, which type
    the XML formats' arguments; None: the request has none, so no call is read)."""
    family, name = _spec(fmt).family, fmt.name if fmt is not None else "generic"
    return lambda scan: family.read(name, scan, tools)


def unmarked(fmt: ToolFormat, text: str) -> str:
    """text without the markers format `fmt` writes around its answer."""
    for m in _spec(fmt).answer_marks:
        text = text.replace(m, "")
    return text


def split_reasoning(text: str, started: bool = False, tags: tuple[str, str] = (THINK_OPEN, THINK_CLOSE)
                    ) -> tuple[str | None, str]:
    """(reasoning, rest): the text of a leading <think>...</think> (tags: another format's
    markers), or, when the prompt already opened one, of everything up to </think>."""
    opening, closing = tags
    body = text.lstrip()
    if not started:
        if not body.startswith(opening):
            return None, text
        body = body[len(opening):]
    end = body.find(closing)
    if end < 0:
        return body.strip(), ""  # cut off while still thinking
    return body[:end].strip(), body[end + len(closing):].lstrip()


def write_calls(fmt: ToolFormat, calls: list[dict]) -> str:
    """Calls ({"name", "arguments"}) as a model writes them in format `fmt` (what parse reads back)."""
    return _spec(fmt).family.write(fmt.name, calls)


def call_grammar(fmt: ToolFormat, tools: list[dict], parallel: bool = False) -> str:
    """A Lark grammar (llguidance's dialect) that admits exactly one call of one of `tools`, or
    with `parallel` one or more where the format writes several."""
    return _spec(fmt).family.grammar(fmt.name, tools, parallel)


def answer_grammar(fmt: ToolFormat | None, schema: dict) -> str | None:
    """A Lark grammar for an answer that is JSON of `schema`, where the format writes its answer
    in a message of its own (gpt-oss: the final channel); None where the answer is the JSON alone."""
    return harmony.answer_grammar(schema) if fmt is not None and fmt.name == "gpt_oss" else None


def in_answer(fmt: ToolFormat | None, grammar):
    """A constrain.Grammar for the reply, where it is the answer's: a JSON schema's in the message
    the format writes its answer in (answer_grammar), anything else as it is."""
    text = answer_grammar(fmt, grammar.schema) if grammar is not None and grammar.kind == "json_schema" else None
    if text is None:
        return grammar
    from ..constrain import Grammar

    return Grammar.from_lark(text)


def call_or_json_grammar(fmt: ToolFormat, tools: list[dict], schema: dict) -> str:
    """A Lark grammar admitting one call of `tools` (as call_grammar) or JSON following `schema`:
    tool_choice "auto" with a JSON response_format (the answer, when it is not a call, is that JSON)."""
    if fmt.name == "gpt_oss":
        return harmony.call_or_answer_grammar(tools, schema)
    from ..constrain import guarded

    call = call_grammar(fmt, tools)
    return guarded(f"start: tool_call | answer\ntool_call: {call[len('start: '):]}\nanswer: {json_rule(schema)}",
                   getattr(call, "guard", None))
