"""Running the server: load the model, start the engine's thread, serve HTTP on uvicorn; on
SIGTERM or Ctrl-C stop accepting, let running streams finish for up to `grace` seconds, then
close the engine (what is left ends with a 503 error the client can read) and exit (a second
Ctrl-C stops at once)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading

import uvicorn

from .app import Context, create_app

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def model_id(llm, model: str) -> str:
    """The id clients send as `model`: the alias the server was started with, or the file's stem."""
    return llm.path.stem if os.path.exists(model) else model


def curl_example(url: str, model: str, with_key: bool) -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}]})
    auth = ' -H "Authorization: Bearer $EDGELLM_API_KEY"' if with_key else ""
    return f"curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'"


SHUTDOWN_MARGIN = 5  # seconds uvicorn waits past the grace period for the last responses to go out


class _Server(uvicorn.Server):
    """uvicorn's server, telling the application when it is ready and when shutdown begins, and
    closing the engine when the grace period is over."""

    def __init__(self, config, ctx: Context, grace: float, on_ready):
        super().__init__(config)
        self._ctx = ctx
        self._grace = grace
        self._on_ready = on_ready

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started:
            self._on_ready(self.servers[0].sockets[0].getsockname()[:2])

    async def shutdown(self, sockets=None):
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self._grace, lambda: loop.run_in_executor(None, self._ctx.close_engine))
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    @contextlib.contextmanager
    def capture_signals(self):
        # as uvicorn's, without re-raising the signal after a clean drain (exit status 0)
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig, frame):
        if not self._ctx.draining:
            self._ctx.draining = True
            stats = self._ctx.engine.stats()
            print(f"edgellm serve: stopping; {stats['running']} running, {stats['waiting']} waiting "
                  f"(up to {self._grace} s; Ctrl-C again to stop now)",
                  file=sys.stderr, flush=True)
        super().handle_exit(sig, frame)


def serve(model: str, *, host: str = "127.0.0.1", port: int = 8080, parallel: int = 8, n_ctx: int = 4096,
          n_threads: int | None = None, kv_tokens: int | None = None, api_key: str | None = None,
          max_queue: int = 128, grace: int = 30, verbose: bool = False, chat_template: str | None = None,
          cache_type_k: str = "f16", cache_type_v: str = "f16", mlock: bool = False, speculative=None,
          lazy_kv: bool = False) -> None:
    """kv_tokens: KV cache tokens all sequences share (default: parallel x the context, so every
    slot can fill its context); its memory is taken at startup, refused there if it is not
    available, unless lazy_kv (taken as it is first written: a server's memory then grows while
    its prefix cache fills, up to the same size). chat_template: Jinja
    source used instead of the model's own. cache_type_k / _v: the KV cache types and mlock
    (LLM's). speculative: the requests' default speculative decoding (a speculative.Speculative;
    a draft model given by path is loaded beside the model and its vocabulary checked)."""
    from ..api import LLM
    from ..scheduler import BatchEngine

    llm = LLM(model, n_ctx=n_ctx, n_threads=n_threads, progress=True, chat_template=chat_template,
              cache_type_k=cache_type_k, cache_type_v=cache_type_v, mlock=mlock)
    llm.template  # a template that does not compile fails now, not at the first request
    if kv_tokens is not None and kv_tokens < llm.n_ctx:
        raise ValueError(f"--kv-tokens {kv_tokens} is less than the context ({llm.n_ctx}): one full request would "
                         f"not fit")
    engine = BatchEngine(llm, max_seqs=parallel, kv_tokens=kv_tokens or parallel * llm.n_ctx, prefix_cache=True,
                         max_queue=max_queue, speculative=speculative)
    kv_mib = None if lazy_kv else engine.claim_kv() / 2**20
    engine.start()
    ctx = Context(llm=llm, engine=engine, model_id=model_id(llm, model), api_key=api_key, max_seqs=parallel,
                  max_queue=max_queue)

    def ready(addr):
        h, p = addr
        url = f"http://{'[' + h + ']' if ':' in h else h}:{p}"
        print(f"edgellm serve: {ctx.model_id} ({llm.config.arch}, {llm.backend}, {llm.n_threads} threads, "
              f"{parallel} parallel, context {llm.n_ctx}, KV cache {engine.kv_tokens} tokens"
              f"{'' if kv_mib is None else f' ({kv_mib:.0f} MiB)'}"
              f"{', ' + engine.speculative.describe() if engine.speculative else ''}) at {url}/v1", flush=True)
        print(f"  try: {curl_example(url, ctx.model_id, api_key is not None)}", flush=True)

    config = uvicorn.Config(create_app(ctx), host=host, port=port, log_level="info" if verbose else "warning",
                            access_log=verbose, timeout_graceful_shutdown=grace + SHUTDOWN_MARGIN, lifespan="off")
    try:
        _Server(config, ctx, grace, ready).run()
    finally:
        ctx.close_engine()
        llm.close()
