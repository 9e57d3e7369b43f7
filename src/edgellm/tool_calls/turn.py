"""One assistant turn: the caller's tools and messages checked, rendered as far as the chat
template can take them (its probed ChatTemplate.tool_caps), and the reply read back."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import TemplateError
from ..tool_caps import ToolCaps
from .common import GENERIC, ToolFormat
from .formats import call_grammar, detect_format, preserved_markers, reasoning_tags, thinking_field, write_calls
from .reply import Reply


def check_tools(tools) -> list[dict]:
    if not isinstance(tools, list) or not tools:
        raise TemplateError("tools must be a non-empty list of {'type': 'function', 'function': {...}}")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise TemplateError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise TemplateError(f"tools[{i}].function needs a name")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise TemplateError(f"tools[{i}].function.parameters must be a JSON schema object")
    return tools


def chosen_tools(tools: list[dict], tool_choice) -> tuple[list[dict], bool]:
    """(the tools a call may use, whether a call is required) for OpenAI's tool_choice."""
    if tool_choice in (None, "auto"):
        return tools, False
    if tool_choice == "none":
        return [], False
    if tool_choice == "required":
        return tools, True
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        picked = [t for t in tools if t["function"]["name"] == name]
        if not picked:
            raise TemplateError(f"tool_choice names {name!r}, which is not among the tools")
        return picked, True
    raise TemplateError(f'tool_choice must be "auto", "none", "required" or {{"type": "function", '
                        f'"function": {{"name": ...}}}}, got {tool_choice!r}')


def _assumed_caps(fmt: ToolFormat) -> ToolCaps:
    """What a format's markers suggest the template does, for a caller of prepare_messages that
    has no probed ChatTemplate.tool_caps: a template with a format of its own renders calls (as
    objects, but Functionary v3.2's text) and results; any other renders results only."""
    return ToolCaps(supports_tools=fmt.native, supports_tool_calls=fmt.native,
                    object_arguments=fmt.name != "functionary", requires_object_arguments=False,
                    supports_parallel_tool_calls=fmt.native, supports_tool_responses=True)


def _check_calls(messages: list) -> None:
    """Each message's tool_calls as OpenAI sends them: a list of {"id": text, "type": "function",
    "function": {"name": text, "arguments": JSON text or an object}}."""
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if calls is None:
            continue
        shape = "a list of {'id': ..., 'type': 'function', 'function': {'name': ..., 'arguments': ...}}"
        if not isinstance(calls, list):
            raise TemplateError(f"message {i}: tool_calls must be {shape}, got {type(calls).__name__}")
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if (not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]
                    or not isinstance(c.get("id"), (str, type(None)))
                    or not isinstance(fn.get("arguments"), (str, dict, type(None)))):
                raise TemplateError(f"message {i}: tool_calls[{j}] must be {shape[len('a list of '):]} with a "
                                    f"name and text or object arguments, got {c!r:.80}")


def _parsed_calls(calls: list) -> list[dict]:
    """(name, arguments as an object) of each call; arguments that are not JSON are an error."""
    out = []
    for c in calls:
        fn = c["function"]
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                raise TemplateError(f"tool call {fn.get('name')!r}: arguments are not JSON: {args!r:.80}") from None
        out.append({"name": fn["name"], "arguments": {} if args is None else args})
    return out


def _text(content) -> str | None:
    """A message's content as text (a list of text parts joined with newlines), or None for
    anything else (the template's render names the problem)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "\n".join(p["text"] for p in content)
    return None


def _result_text(m: dict, names: dict) -> str:
    call_id = m.get("tool_call_id") if isinstance(m.get("tool_call_id"), str) else None
    name = m.get("name") or names.get(call_id)
    said = ", ".join(x for x in (name and f"tool {name}", call_id and f"call {call_id}") if x)
    return f"Tool result{f' ({said})' if said else ''}:\n{_text(m.get('content'))}"


def _with_thinking(messages: list, calls_drop_content: bool) -> list:
    """An assistant message's reasoning_content as the template's `thinking` (formats.Format.thinking_field)."""
    out = []
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("reasoning_content"), str):
            m = {**m, "thinking": m["reasoning_content"]}
            if calls_drop_content and m.get("tool_calls"):
                m.pop("content", None)
        out.append(m)
    return out


def _one_call_at_a_time(messages: list) -> list:
    """An assistant message with several calls as one message per call, each followed by its
    results (matched by tool_call_id, else in order): for a template that renders one call a
    message (Llama 3.x refuses more, gpt-oss writes the first)."""
    out, i = [], 0
    while i < len(messages):
        m = messages[i]
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        i += 1
        if not calls or len(calls) < 2:
            out.append(m)
            continue
        results = []
        while i < len(messages) and isinstance(messages[i], dict) and messages[i].get("role") == "tool":
            results.append(messages[i])
            i += 1
        ids = [c.get("id") if isinstance(c, dict) else None for c in calls]
        by_id = None not in ids and len(set(ids)) == len(ids) and all(r.get("tool_call_id") in ids for r in results)
        for k, c in enumerate(calls):
            out.append({**m, "content": m.get("content") if k == 0 else "", "tool_calls": [c]})
            out += [r for j, r in enumerate(results) if (r.get("tool_call_id") == ids[k] if by_id else j == k)]
        out += [] if by_id else results[len(calls):]
    return out


def prepare_messages(messages: list[dict], fmt: ToolFormat, caps: ToolCaps | None = None) -> list[dict]:
    """Messages as the template can take them (caps: its ChatTemplate.tool_caps; without them,
    what `fmt` suggests). Tool-call arguments as objects or as JSON text, whichever the template
    renders; several calls in one message, for a template that renders one, as one message per
    call; an assistant's calls that the template cannot render written into its content as the
    model writes them in `fmt`; role "tool" results that the template drops turned into a user
    message naming the tool and call (one for consecutive results, joined with the user message
    after them)."""
    _check_calls(messages)
    caps = caps or _assumed_caps(fmt)
    if thinking_field(fmt) is not None:
        messages = _with_thinking(messages, thinking_field(fmt))
    if caps.supports_tool_calls and not caps.supports_parallel_tool_calls:
        messages = _one_call_at_a_time(messages)
    out: list[dict] = []
    names: dict = {}  # call id -> tool name, for results that do not name their tool
    pending: list[str] = []  # results of tools, turned into text, for the next user message
    for m in messages:
        if not isinstance(m, dict):  # (the template's render names the problem)
            out.append(m)
            continue
        if pending and m.get("role") != "tool":
            text = "\n\n".join(pending)
            pending = []
            if m.get("role") == "user" and _text(m.get("content")) is not None:
                m = {**m, "content": text + "\n\n" + _text(m["content"])}
            else:
                out.append({"role": "user", "content": text})
        calls = m.get("tool_calls")
        if calls:
            parsed = _parsed_calls(calls)
            names.update((c.get("id"), p["name"]) for c, p in zip(calls, parsed))
            if caps.supports_tool_calls:
                fixed = []
                for c, p in zip(calls, parsed):
                    fn = dict(c["function"])
                    if caps.object_arguments:
                        fn["arguments"] = p["arguments"]
                    elif not isinstance(fn.get("arguments"), str):
                        fn["arguments"] = json.dumps(p["arguments"], ensure_ascii=False)
                    fixed.append({**c, "function": fn})
                m = {**m, "tool_calls": fixed}
            else:
                said = _text(m.get("content")) or ""
                m = {k: v for k, v in m.items() if k != "tool_calls"}
                m["content"] = "\n".join(x for x in (said.strip(), write_calls(fmt, parsed)) if x)
        elif m.get("role") == "tool" and not caps.supports_tool_responses and _text(m.get("content")) is not None:
            pending.append(_result_text(m, names))
            continue
        out.append(m)
    if pending:
        out.append({"role": "user", "content": "\n\n".join(pending)})
    return out


def describe_tools(tools: list[dict], fmt: ToolFormat = GENERIC, listed: bool = True) -> str:
    """System-message text: the tools (unless the template lists them: listed=False) and how to
    call one in format `fmt` (for the generic format, which the template does not teach)."""
    specs = "You can call these tools:\n" + json.dumps([t["function"] for t in tools], ensure_ascii=False) + "\n"
    if fmt.name == "generic":
        how = ('To call a tool, reply with only {"tool_call": {"name": <tool name>, "arguments": <its arguments>}}; '
               'otherwise reply with {"response": <your answer>}.')
    else:
        name = tools[0]["function"]["name"]
        how = f"To call a tool, write the call in this form (here {name} with no arguments): " + \
            write_calls(fmt, [{"name": name, "arguments": {}}])
    return (specs if listed else "") + how


def with_tool_description(messages: list[dict], tools: list[dict], fmt: ToolFormat = GENERIC,
                          listed: bool = True) -> list[dict]:
    """`messages` with describe_tools' text at the end of the system message (or in a new one)."""
    text = describe_tools(tools, fmt, listed)
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}] + list(messages[1:])
    return [{"role": "system", "content": text}] + list(messages)


@dataclass
class ChatTurn:
    """A rendered chat prompt and what is needed to read the reply back."""

    prompt: str
    fmt: ToolFormat
    grammar: str | None  # Lark for a required call, else None
    thinking: bool  # the prompt opened a reasoning block (<think>) the reply continues
    tools: bool
    usable: tuple = ()  # the tools a call may use (their schemas type XML arguments)

    @property
    def markers(self) -> tuple[str, ...]:
        """The marker texts the reply is read by, kept in its text (formats.preserved_markers)."""
        return preserved_markers(self.fmt, self.tools)

    def reply(self, json_answer: bool = False, parallel: bool = True) -> Reply:
        """A reader of the reply as it streams (reply.Reply: OpenAI's deltas and message).
        json_answer: the answer is constrained JSON; parallel: several calls are kept."""
        return Reply(self.fmt, calls=self.tools, thinking=self.thinking, json_answer=json_answer, parallel=parallel,
                     tools=self.usable)

    def message(self, text: str, stop_reason: str, **kw) -> tuple[dict, str]:
        """(OpenAI-style assistant message, finish_reason) for the whole reply `text`: what its
        stream adds up to (kw: reply's). stop_reason: LLM.last_stats'."""
        reply = self.reply(**kw)
        reply.feed(text)
        reply.close()
        return reply.message(), finish_reason(reply, stop_reason)


def finish_reason(reply: Reply, stop_reason: str) -> str:
    """OpenAI's finish_reason for a reply the library generated (stop_reason: LLM.last_stats'):
    "length" where max_tokens cut it, else "tool_calls" or "stop"."""
    return reply.finish_reason("length" if stop_reason == "length" else "stop")


def prepare_turn(template, messages: list[dict], tools=None, tool_choice=None, parallel: bool = False) -> ChatTurn:
    """Render `messages` (and `tools`, as transformers passes them) for the next assistant turn,
    as far as the template can take them (its probed tool_caps): tools it does not list are
    described in the system message, calls and results it cannot render become text.
    parallel: tool_choice "required" admits several calls where the format writes them."""
    fmt = detect_format(template.source)
    if tools is None:
        if tool_choice not in (None, "none", "auto"):
            raise TemplateError("tool_choice needs tools")
        toolish = any(isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in messages)
        msgs = prepare_messages(messages, fmt, template.tool_caps) if toolish else messages
        prompt = template.render(msgs, add_generation_prompt=True, **template.tool_context(None))
        return ChatTurn(prompt, fmt, None, _opens_think(prompt, fmt), False)
    caps = template.tool_caps
    tools = check_tools(tools)
    usable, required = chosen_tools(tools, tool_choice)
    msgs = prepare_messages(messages, fmt, caps)
    if usable and (not caps.supports_tools or fmt.name == "generic"):
        msgs = with_tool_description(msgs, usable, fmt, listed=not caps.supports_tools)
    # a template that does not list tools gets none (some fail on them: llama-cpp-deepseek-r1)
    listed = (usable or None) if caps.supports_tools else None
    prompt = template.render(msgs, add_generation_prompt=True, tools=listed, **template.tool_context(listed))
    grammar = call_grammar(fmt, usable, parallel and tool_choice == "required") if required else None
    return ChatTurn(prompt, fmt, grammar, _opens_think(prompt, fmt), bool(usable), tuple(usable))


def _opens_think(prompt: str, fmt: ToolFormat) -> bool:
    return prompt.rstrip().endswith(reasoning_tags(fmt)[0])
