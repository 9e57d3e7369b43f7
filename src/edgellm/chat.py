"""Chat templates: the Jinja2 template a GGUF file carries (``tokenizer.chat_template``), rendered
in a sandbox the way Hugging Face transformers renders it (chat_sandbox.py, with bounds on the work
one render may do), with a built-in fallback for models that carry none."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.exceptions import SecurityError

from .chat_sandbox import SANDBOX, RaisedByTemplate, render, template_now
from .errors import TemplateError, TokenizerError
from .tool_caps import ToolCaps, probe

# Markers that end a turn in the common template families (ChatML, Gemma, Llama 3, Phi-3); the
# ones a template writes become its stop strings.
END_OF_TURN_MARKERS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|eot|>")  # (<|eot|>: Muse Glimmer)
# gpt-oss and Solar Open: <|end|> ends one message of a reply, and these end the turn (llama.cpp's
# vocabulary rule: where a model has <|call|> or <|calls|>, <|end|> does not end generation)
MESSAGE_END, TURN_ENDS = "<|end|>", ("<|return|>", "<|call|>", "<|calls|>", "<|flush|>")

# Built-in templates, used when the GGUF file has none. They write no BOS: the tokenizer adds it
# when the model's metadata asks for one.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Gemma has no system role: system text goes at the top of the next user turn, then a blank
# line; "assistant" is "model"; contents are trimmed (as llama.cpp's built-in "gemma" template
# in src/llama-chat.cpp, and Google's own Gemma 3 template).
GEMMA_TEMPLATE = (
    "{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% set ns.system = ns.system + (message['content'] | trim) %}"
    "{% else %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{% if ns.system and role != 'model' %}{{ ns.system + '\n\n' }}{% set ns.system = '' %}{% endif %}"
    "{{ (message['content'] | trim) + '<end_of_turn>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3", "gemma3n"})

def _compile(source: str) -> jinja2.Template:
    try:
        return SANDBOX.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template syntax error at line {e.lineno}: {e.message}") from None
    except (RecursionError, SyntaxError) as e:  # nested too deep for Jinja's parser or Python's
        raise TemplateError(f"chat template too deeply nested to compile: {type(e).__name__}") from None


def _normalize_messages(messages) -> list[dict]:
    """Check the messages and return copies whose content is a string: a list of text parts is
    joined with newlines (as llama.cpp's common chat code does for templates that take strings)."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise TemplateError(f"messages must be a list of dicts, got {type(messages).__name__}")
    if not messages:
        raise TemplateError("messages is empty: give at least one message")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise TemplateError(f"message {i} must be a dict with 'role' and 'content', got {type(msg).__name__}")
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise TemplateError(f"message {i}: 'role' must be a non-empty string, got {role!r}")
        content = msg.get("content")
        if content is None and msg.get("tool_calls"):
            content = ""  # OpenAI leaves it out (or null) beside tool calls; templates want a string
        elif "content" not in msg:
            raise TemplateError(f"message {i} ({role}) has no 'content'")
        if isinstance(content, (list, tuple)):
            texts = []
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, Mapping) else None
                if kind != "text":
                    raise TemplateError(
                        f"message {i} ({role}): content part {j} must be "
                        f"{{'type': 'text', 'text': ...}}, got {part!r:.80}"
                    )
                if not isinstance(part.get("text"), str):
                    raise TemplateError(f"message {i} ({role}): content part {j} has no string 'text'")
                texts.append(part["text"])
            content = "\n".join(texts)
        elif not isinstance(content, str):
            raise TemplateError(
                f"message {i} ({role}): 'content' must be a string or a list of text parts, "
                f"got {type(content).__name__}"
            )
        out.append({**msg, "content": content})
    return out


class ChatTemplate:
    """Turns a list of chat messages into the prompt text the model was trained on.

    ``template`` is Jinja2 source (a GGUF's ``tokenizer.chat_template``); None picks a built-in
    one by ``arch`` (Gemma turns for gemma architectures, ChatML otherwise). ``bos_token`` and
    ``eos_token`` are the texts the template sees as ``bos_token``/``eos_token``. With
    ``add_bos``/``add_eos`` (the tokenizer adds BOS/EOS itself), a BOS the template writes at the
    start and an EOS it writes at the end are removed from the result, so they are not doubled
    (as llama.cpp's common_chat_template_direct_apply)."""

    def __init__(
        self,
        template: str | None,
        *,
        bos_token: str = "",
        eos_token: str = "",
        arch: str | None = None,
        add_bos: bool = False,
        add_eos: bool = False,
    ):
        if template is not None and not isinstance(template, str):
            raise TemplateError(f"chat template must be a string, got {type(template).__name__}")
        self.is_builtin = template is None or not template.strip()
        if self.is_builtin:
            template = GEMMA_TEMPLATE if arch in GEMMA_ARCHS else CHATML_TEMPLATE
        self.source = template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.arch = arch
        self.add_bos = add_bos
        self.add_eos = add_eos
        self._template = _compile(template)
        self._reads = meta.find_undeclared_variables(SANDBOX.parse(template))
        self._supports_system: bool | None = None
        self._tool_caps: ToolCaps | None = None
        stops = [m for m in END_OF_TURN_MARKERS if m in template]
        if "<|call|>" in template or "<|calls|>" in template:
            stops = [m for m in stops if m != MESSAGE_END] + [m for m in TURN_ENDS if m in template]
        if eos_token and eos_token not in stops:
            stops.append(eos_token)
        self.stop_strings: list[str] = stops

    @classmethod
    def from_metadata(
        cls,
        meta: Mapping[str, Any],
        token_text: Callable[[int], str] | None = None,
        *,
        add_bos: bool | None = None,
        add_eos: bool | None = None,
    ) -> ChatTemplate:
        """From GGUF metadata: ``tokenizer.chat_template``, ``general.architecture``, and the BOS/EOS
        texts (``tokenizer.ggml.bos_token_id``/``eos_token_id`` looked up with ``token_text``, or in
        ``tokenizer.ggml.tokens``). ``add_bos``/``add_eos`` default to the
        ``tokenizer.ggml.add_bos_token``/``add_eos_token`` keys (False when absent; pass the
        tokenizer's own decision when it infers one)."""

        def text_of(key: str) -> str:
            tid = meta.get(key)
            if tid is None:
                return ""
            if token_text is not None:
                return token_text(int(tid))
            tokens = meta.get("tokenizer.ggml.tokens")
            if tokens is None:
                raise TokenizerError(f"{key} is set but tokenizer.ggml.tokens is missing")
            if not 0 <= int(tid) < len(tokens):
                raise TokenizerError(f"{key} = {tid} is outside the vocabulary of {len(tokens)} tokens")
            return str(tokens[int(tid)])

        arch = meta.get("general.architecture")
        return cls(
            meta.get("tokenizer.chat_template"),
            bos_token=text_of("tokenizer.ggml.bos_token_id"),
            eos_token=text_of("tokenizer.ggml.eos_token_id"),
            arch=arch if isinstance(arch, str) else None,  # another type is the model loader's error
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)) if add_bos is None else add_bos,
            add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)) if add_eos is None else add_eos,
        )

    @property
    def supports_system_role(self) -> bool:
        """Whether the template writes a system message's text (probed once, as llama.cpp probes
        a template's capabilities: render a system message and look for its text)."""
        return self._system_role({})

    def _system_role(self, extra: dict) -> bool:
        if self._supports_system is None:
            probe = "\u2063system-probe\u2063"
            try:
                out = self._render([{"role": "system", "content": probe}, {"role": "user", "content": "u"}],
                                   add_generation_prompt=True, tools=None, extra=extra)
            except TemplateError:
                out = ""
            self._supports_system = probe in out
        return self._supports_system

    @property
    def tool_caps(self) -> ToolCaps:
        """What the template does with tools, tool calls and tool results (tool_caps.probe, run
        once)."""
        if self._tool_caps is None:
            self._tool_caps = probe(self._probe_render)
        return self._tool_caps

    def tool_context(self, tools: list | None) -> dict:
        """Variables the template reads beside messages and tools, which transformers leaves to
        the caller, as llama.cpp gives them: firefunction-v2's `functions` (the tools as JSON)
        and `datetime` (today's date)."""
        out = {}
        if "functions" in self._reads:
            out["functions"] = json.dumps(tools, indent=2, ensure_ascii=False) if tools else ""
        if "datetime" in self._reads:
            out["datetime"] = template_now().strftime("%b %d %Y")
        return out

    def _probe_render(self, messages: list[dict], tools: list | None, add_generation_prompt: bool) -> str | None:
        try:
            return self._render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                extra=self.tool_context(tools))
        except TemplateError:
            return None

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True, tools: list | None = None,
               **extra) -> str:
        """The prompt for ``messages`` (dicts with a ``role`` and a string or list-of-text-parts
        ``content``), ending with the assistant's turn opener if ``add_generation_prompt``.
        ``tools`` (OpenAI's function specs) and ``extra`` keywords reach the template as
        transformers' apply_chat_template passes them. For a template without a system role, a
        leading system message is folded into the next message (its text, a newline, then that
        message's), as llama.cpp does."""
        msgs = _normalize_messages(messages)
        if msgs[0]["role"] == "system" and not self._system_role(extra):
            system, msgs = msgs[0], msgs[1:]
            if msgs:
                msgs[0] = {**msgs[0], "content": system["content"] + "\n" + msgs[0]["content"]}
            else:
                raise TemplateError("this chat template has no system role, and there is no message to fold "
                                    "the system message into")
        return self._render(msgs, add_generation_prompt=add_generation_prompt, tools=tools, extra=extra)

    def _render(self, msgs: list[dict], *, add_generation_prompt: bool, tools, extra: dict) -> str:
        context = {"tools": tools, "documents": None, **extra}  # defined, maybe None, as transformers passes them
        try:
            text = render(self._template, {
                **context,
                "messages": msgs,
                "add_generation_prompt": bool(add_generation_prompt),
                "bos_token": self.bos_token,
                "eos_token": self.eos_token,
            })
        except RaisedByTemplate as e:
            raise TemplateError(f"the chat template rejected the messages: {e}") from None
        except SecurityError as e:
            raise TemplateError(f"the chat template attempted something not allowed: {e}") from None
        except TypeError as e:
            if "no loader" in str(e):
                raise TemplateError("chat templates cannot include or import other templates") from None
            raise TemplateError(f"the chat template failed to render: {e}") from None
        except (jinja2.TemplateError, ArithmeticError, LookupError, ValueError, AttributeError, RecursionError) as e:
            raise TemplateError(f"the chat template failed to render: {type(e).__name__}: {e}") from None
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token) :]
        if self.add_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[: -len(self.eos_token)]
        return text
