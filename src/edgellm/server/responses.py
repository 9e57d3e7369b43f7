"""OpenAI's response bodies: chat.completion / text_completion objects, their streamed chunks
(server-sent events), logprobs in each endpoint's shape, and usage. A chat choice's message and
deltas come from its tool_calls.Reply (content, reasoning_content, tool_calls); a completion's from
TextReply (its text as written)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

DONE = b"data: [DONE]\n\n"


def sse(obj) -> bytes:
    """One server-sent event carrying a JSON object."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def usage(sub) -> dict:
    """Prompt tokens once per prompt (not per choice forked from it), completion tokens of every choice."""
    prompt = sum(sub.requests[i].usage.prompt_tokens for i in sub.prompt_starts)
    cached = sum(sub.requests[i].usage.cached_tokens for i in sub.prompt_starts)
    completion = sum(r.usage.completion_tokens for r in sub.requests)
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}}
    if any(r.spec is not None for r in sub.requests):  # speculative decoding, in OpenAI's predicted-output terms
        drafted = sum(r.usage.draft_tokens for r in sub.requests)
        accepted = sum(r.usage.accepted_tokens for r in sub.requests)
        out["completion_tokens_details"] = {"accepted_prediction_tokens": accepted,
                                            "rejected_prediction_tokens": drafted - accepted}
    return out


@dataclass
class Choice:
    """What one choice has produced: the (token, logprob, top) of each token, and how long its text is."""

    tokens: list[tuple[int, float, list | None]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # where each token's text starts (text_offset)
    length: int = 0  # characters of text so far
    _sent_tokens: int = 0  # how many of tokens the stream has sent

    def add(self, event) -> None:
        if event.logprob is not None:
            self.tokens.append((event.token, event.logprob, event.top_logprobs))
            self.offsets.append(self.length)
        self.length += len(event.text)

    def unsent(self) -> tuple[list, list[int]]:
        """Tokens and their offsets added since the last call (what the next chunk carries)."""
        tokens, offsets = self.tokens[self._sent_tokens:], self.offsets[self._sent_tokens:]
        self._sent_tokens = len(self.tokens)
        return tokens, offsets


class TextReply:
    """A completion's reply: its text as written, in the pieces it comes in."""

    def __init__(self):
        self.pieces: list[str] = []

    def feed(self, text: str) -> list[dict]:
        self.pieces.append(text)
        return [{"text": text}] if text else []

    def close(self) -> list[dict]:
        return []

    def finish_reason(self, engine_reason: str) -> str:
        return engine_reason


class Format:
    """Shared by both endpoints: ids, envelopes; `tokenizer` names tokens in logprobs."""

    object: str
    id_prefix: str

    def __init__(self, model: str, fingerprint: str, tokenizer):
        self.id = self.id_prefix + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model
        self.fingerprint = fingerprint
        self._tok = tokenizer

    def _token(self, token_id: int) -> tuple[str, bytes]:
        b = self._tok.token_bytes(token_id)
        return b.decode("utf-8", errors="replace"), b

    def envelope(self, choices: list, chunk: bool, usage=None, include_usage: bool = False) -> dict:
        out = {"id": self.id, "object": self.object + (".chunk" if chunk and self.object != "text_completion" else ""),
               "created": self.created, "model": self.model, "system_fingerprint": self.fingerprint,
               "choices": choices}
        if not chunk or include_usage:
            out["usage"] = usage
        return out


class ChatFormat(Format):
    object = "chat.completion"
    id_prefix = "chatcmpl-"

    def _entry(self, token_id: int, logprob: float) -> dict:
        text, b = self._token(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(b)}

    def logprobs(self, tokens) -> dict:
        content = []
        for tok, lp, top in tokens:
            entry = self._entry(tok, lp)
            entry["top_logprobs"] = [self._entry(t, v) for t, v in (top or [])]
            content.append(entry)
        return {"content": content, "refusal": None}

    def choice(self, i: int, c: Choice, reply, reason: str, want_logprobs: bool, prefix: str = "") -> dict:
        return {"index": i, "message": {**reply.message(), "refusal": None},
                "logprobs": self.logprobs(c.tokens) if want_logprobs else None, "finish_reason": reason}

    def first_delta(self, i: int, prefix: str = "", tools: bool = False) -> dict:
        # with tools the content may never come (a call instead): null until it does, as OpenAI sends it
        return {"index": i, "delta": {"role": "assistant", "content": None if tools else ""}, "logprobs": None,
                "finish_reason": None}

    def delta(self, i: int, piece: dict, tokens, offsets, want_logprobs: bool, base: int = 0) -> dict:
        return {"index": i, "delta": piece, "logprobs": self.logprobs(tokens) if want_logprobs else None,
                "finish_reason": None}

    def last_delta(self, i: int, reason: str) -> dict:
        return {"index": i, "delta": {}, "logprobs": None, "finish_reason": reason}


class CompletionFormat(Format):
    object = "text_completion"
    id_prefix = "cmpl-"

    def logprobs(self, tokens, offsets: list[int], base: int) -> dict:
        names = [self._token(t)[0] for t, _, _ in tokens]
        top = [None if t is None else {self._token(k)[0]: v for k, v in t} for _, _, t in tokens]
        return {"tokens": names, "token_logprobs": [lp for _, lp, _ in tokens],
                "top_logprobs": top if any(t is not None for t in top) else None,
                "text_offset": [base + o for o in offsets]}

    def choice(self, i: int, c: Choice, reply, reason: str, want_logprobs: bool, prefix: str = "") -> dict:
        return {"text": prefix + "".join(reply.pieces), "index": i,
                "logprobs": self.logprobs(c.tokens, c.offsets, len(prefix)) if want_logprobs else None,
                "finish_reason": reason}

    def first_delta(self, i: int, prefix: str = "", tools: bool = False) -> dict:
        return {"text": prefix, "index": i, "logprobs": None, "finish_reason": None}

    def delta(self, i: int, piece: dict, tokens, offsets, want_logprobs: bool, base: int = 0) -> dict:
        return {"text": piece.get("text", ""), "index": i, "logprobs": self.logprobs(tokens, offsets, base) if want_logprobs else None,
                "finish_reason": None}

    def last_delta(self, i: int, reason: str) -> dict:
        return {"text": "", "index": i, "logprobs": None, "finish_reason": reason}
