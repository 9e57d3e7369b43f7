"""The endpoints: OpenAI's chat/completions, completions and models; llama.cpp's tokenize and
detokenize; health and metrics. Each handler takes the server's `Context` and the request and
returns a response or raises `APIError`; app.py adds authentication, error bodies and counting."""

from __future__ import annotations

import asyncio
import json

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..errors import ContextOverflowError, EdgeLLMError, GrammarError
from ..scheduler import QueueFullError
from ..speculative import Speculative
from .bridge import Submission
from .errors import APIError, invalid, model_not_found, queue_full, server_error, shutting_down, too_large
from .responses import DONE, ChatFormat, Choice, CompletionFormat, TextReply, sse, usage
from .schemas import SERVER_DEFAULT, Generation, parse_chat, parse_completion, parse_detokenize, parse_tokenize
from .structured import chat_plan, completion_grammar

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: Request, limit: int):
    """The body as JSON, read no further than `limit` bytes (413 beyond)."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks), parse_constant=_reject_constant)
        _check_unicode(body)
        return body
    except (ValueError, UnicodeError) as exc:
        raise invalid(None, f"We could not parse the JSON body of your request ({exc}). The body must be JSON.",
                      "invalid_json") from None


def _check_unicode(value) -> None:
    """JSON may escape half a surrogate pair ("\\ud800"), which is no character: refused here, since
    nothing can tokenize, echo or report it as UTF-8 (UnicodeEncodeError names the string's offset)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            v.encode("utf-8")
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())


# -- generation --------------------------------------------------------------------------------


def _max_tokens(ctx, ids: list[int], gen: Generation, what: str) -> int:
    """The completion's token budget: as asked, or what the context leaves; 400 with the numbers
    when prompt and completion do not fit."""
    n_ctx, p = ctx.llm.n_ctx, len(ids)
    want = gen.max_tokens if gen.max_tokens is not None else max(n_ctx - p, 1)
    if p + want > n_ctx:
        raise invalid("messages" if what == "messages" else "prompt",
                      f"This model's maximum context length is {n_ctx} tokens. However, you requested {p + want} "
                      f"tokens ({p} in the {what}, {want} in the completion). Please reduce the length of the "
                      f"{what} or completion.", "context_length_exceeded")
    return want


def _failure(req) -> APIError:
    """Why a choice ended other than by stop or length."""
    if req.finish_reason == "cancelled":  # by the engine closing (a client that left reads nothing)
        return shutting_down()
    if isinstance(req.error, ContextOverflowError):
        return invalid(None, str(req.error), "context_length_exceeded")
    return server_error(f"Generation failed: {type(req.error).__name__}: {req.error}")


def _speculative(ctx, gen: Generation) -> dict:
    """engine.submit's speculative= for the request's `speculative` field ({}: the server's)."""
    if gen.speculative == SERVER_DEFAULT:
        return {}
    if gen.speculative == "none":
        return {"speculative": None}
    spec = ctx.engine.speculative
    if gen.speculative == "lookup":
        return {"speculative": spec if spec is not None and spec.is_lookup else Speculative("lookup")}
    if spec is None or spec.is_lookup:
        raise invalid("speculative", "'speculative': 'draft' needs a server started with a draft model "
                                     "(edgellm serve --draft MODEL).")
    return {"speculative": spec}


async def _generate(ctx, request: Request, gen: Generation, prompts: list[list[int]], stops: list[str], fmt,
                    what: str, *, make_reply=TextReply, grammar=None, tools: bool = False,
                    prefixes: list[str] | None = None, preserved: frozenset[int] = frozenset()) -> Response:
    """Generate gen.n choices for each prompt and answer (streamed or not); make_reply() reads
    one choice's text into the pieces the format sends (content, tool calls, ...); preserved: the
    control tokens the text keeps (a chat format's markers)."""
    if ctx.draining:
        raise shutting_down()
    budgets = [_max_tokens(ctx, ids, gen, what) for ids in prompts]
    sub = Submission(ctx.engine, ctx.metrics, ctx.outbox())
    spec = _speculative(ctx, gen)

    def submit_all():
        for ids, budget in zip(prompts, budgets):
            sub.submit(ids, n=gen.n, max_tokens=budget, sampling=gen.sampling, stop=stops, logprobs=gen.logprobs,
                       logit_bias=gen.logit_bias, grammar=grammar, preserved=preserved, **spec)

    try:
        if grammar is None:
            submit_all()
        else:  # each choice starts its own matcher: off the event loop
            await run_in_threadpool(submit_all)
    except BaseException as exc:
        sub.cancel()  # the prompts already queued
        if isinstance(exc, QueueFullError):
            raise queue_full(str(exc)) from None
        if isinstance(exc, ContextOverflowError):
            raise invalid(what if what == "messages" else "prompt", str(exc), "context_length_exceeded") from None
        if isinstance(exc, GrammarError):
            raise invalid(gen.output.field or "tools", str(exc)) from None
        if isinstance(exc, ValueError):
            raise invalid(None, str(exc)) from None
        if isinstance(exc, EdgeLLMError) and ctx.draining:  # the engine closed under us
            raise shutting_down() from None
        raise
    choices = [Choice() for _ in sub.requests]
    replies = [make_reply() for _ in sub.requests]
    want_lp = gen.logprobs is not None

    def prefix(i: int) -> str:  # echo: the prompt's text in front of choice i
        return prefixes[i // gen.n] if prefixes else ""

    if gen.stream:
        def chunk(i: int, pieces: list[dict], last: bool = False):
            """The chunks for choice i's new pieces; the tokens not yet sent go with the first."""
            if not pieces and last and want_lp and choices[i].tokens[choices[i]._sent_tokens:]:
                pieces = [{}]  # log-probs of tokens whose text was dropped (whitespace around calls)
            for piece in pieces:
                tokens, offsets = choices[i].unsent()
                yield sse(fmt.envelope([fmt.delta(i, piece, tokens, offsets, want_lp, len(prefix(i)))], True, None,
                                       gen.include_usage))

        async def events():
            try:
                for i in range(len(choices)):
                    yield sse(fmt.envelope([fmt.first_delta(i, prefix(i), tools)], True, None, gen.include_usage))
                async for i, req, ev in sub.events():
                    if ev is not None:
                        choices[i].add(ev)
                        if ev.text:  # else held back: its token goes with the text that releases it
                            for out in chunk(i, replies[i].feed(ev.text)):
                                yield out
                        continue
                    if req.finish_reason not in ("stop", "length"):
                        yield sse(_failure(req).body())
                        return
                    for out in chunk(i, replies[i].close(), last=True):
                        yield out
                    reason = replies[i].finish_reason(req.finish_reason)
                    yield sse(fmt.envelope([fmt.last_delta(i, reason)], True, None, gen.include_usage))
                if gen.include_usage:
                    yield sse(fmt.envelope([], True, usage(sub), True))
                yield DONE
            finally:  # the client left, or the server stops: free the sequences now
                sub.cancel()

        return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

    watcher = asyncio.create_task(_cancel_on_disconnect(request, sub))
    try:
        async for i, req, ev in sub.events():
            if ev is not None:
                choices[i].add(ev)
                replies[i].feed(ev.text)
            elif req.finish_reason not in ("stop", "length"):
                raise _failure(req)
            else:
                replies[i].close()
    finally:
        watcher.cancel()
        sub.cancel()
    out = [fmt.choice(i, c, replies[i], replies[i].finish_reason(sub.requests[i].finish_reason), want_lp, prefix(i))
           for i, c in enumerate(choices)]
    return JSONResponse(fmt.envelope(out, False, usage(sub)))


async def _cancel_on_disconnect(request: Request, sub: Submission) -> None:
    """A client that leaves before its (non-streamed) answer is ready frees its sequences."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    sub.cancel()


def _completion_prompt(ctx, prompt) -> list[int]:
    """Text is tokenized as llama-server does (BOS as the model asks, special tokens parsed);
    token ids are used as given."""
    ids = ctx.llm.tokenize(prompt, add_bos=True, special=True) if isinstance(prompt, str) else prompt
    if not ids:
        raise invalid("prompt", "The prompt is empty (and this model adds no BOS token).")
    return ids


async def chat_completions(ctx, request: Request) -> Response:
    gen = parse_chat(await read_json(request, ctx.max_body), **ctx.limits)
    plan = await run_in_threadpool(chat_plan, ctx.llm, gen)
    stops = gen.stop + [s for s in ctx.llm.template.stop_strings if s not in gen.stop]
    fmt = ChatFormat(ctx.model_id, ctx.fingerprint, ctx.llm.tokenizer)
    return await _generate(ctx, request, gen, [plan.ids], stops, fmt, "messages", make_reply=plan.reply,
                           grammar=plan.grammar, tools=plan.turn.tools, preserved=plan.preserved)


async def completions(ctx, request: Request) -> Response:
    gen = parse_completion(await read_json(request, ctx.max_body), **ctx.limits)
    prompts = await run_in_threadpool(lambda: [_completion_prompt(ctx, p) for p in gen.prompts])
    grammar = await run_in_threadpool(completion_grammar, ctx.llm, gen) if gen.output.field else None
    prefixes = None
    if gen.echo:
        prefixes = [p if isinstance(p, str) else ctx.llm.detokenize(p) for p in gen.prompts]
    fmt = CompletionFormat(ctx.model_id, ctx.fingerprint, ctx.llm.tokenizer)
    return await _generate(ctx, request, gen, prompts, gen.stop, fmt, "prompt", grammar=grammar, prefixes=prefixes)


# -- the rest ----------------------------------------------------------------------------------


def _model_card(ctx) -> dict:
    return {"id": ctx.model_id, "object": "model", "created": ctx.created, "owned_by": "edgellm"}


async def list_models(ctx, request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(ctx)]})


async def get_model(ctx, request: Request) -> Response:
    name = request.path_params["model"]
    if name != ctx.model_id:
        raise model_not_found(name)
    return JSONResponse(_model_card(ctx))


async def tokenize(ctx, request: Request) -> Response:
    text, add_special, parse_special, with_pieces = parse_tokenize(await read_json(request, ctx.max_body),
                                                                   ctx.llm.n_vocab)
    ids = await run_in_threadpool(ctx.llm.tokenize, text, add_bos=add_special, special=parse_special)
    if not with_pieces:
        return JSONResponse({"tokens": ids})
    tok = ctx.llm.tokenizer
    pieces = []
    for i in ids:
        b = tok.token_bytes(i)
        try:
            piece = b.decode("utf-8")
        except UnicodeDecodeError:  # part of a character: its bytes, as llama-server gives them
            piece = list(b)
        pieces.append({"id": i, "piece": piece})
    return JSONResponse({"tokens": pieces})


async def detokenize(ctx, request: Request) -> Response:
    ids = parse_detokenize(await read_json(request, ctx.max_body), ctx.llm.n_vocab)
    return JSONResponse({"content": ctx.llm.detokenize(ids)})


async def health(ctx, request: Request) -> Response:
    if ctx.draining:
        return JSONResponse({"status": "shutting down"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def metrics(ctx, request: Request) -> Response:
    return Response(ctx.metrics.render(), media_type=ctx.metrics.content_type)


# (method, path, handler, open without the API key)
ROUTES = [
    ("POST", "/v1/chat/completions", chat_completions, False),
    ("POST", "/v1/completions", completions, False),
    ("GET", "/v1/models", list_models, False),
    ("GET", "/v1/models/{model:path}", get_model, False),
    ("POST", "/tokenize", tokenize, False),
    ("POST", "/detokenize", detokenize, False),
    ("GET", "/health", health, True),
    ("GET", "/metrics", metrics, False),
]
