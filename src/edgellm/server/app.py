"""The ASGI application: routes.ROUTES behind the API key check, with every error (ours,
Starlette's 404/405, anything unexpected) answered as OpenAI's error JSON and counted."""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from .. import __version__
from .bridge import Outbox
from .errors import APIError, server_error, unauthorized
from .metrics import Metrics
from .routes import ROUTES
from .schemas import MAX_CHOICES

log = logging.getLogger("edgellm.server")

MAX_BODY_BYTES = 8 * 1024 * 1024  # a request body larger than this gets 413


@dataclass
class Context:
    """What the handlers share: the model, its engine, and the server's settings."""

    llm: object
    engine: object
    model_id: str
    api_key: str | None = None
    max_seqs: int = 1
    max_queue: int | None = None  # waiting sequences the engine accepts (a request's n choices all wait at first)
    max_body: int = MAX_BODY_BYTES
    draining: bool = False  # set when shutdown begins: new generations get 503
    metrics: Metrics = field(init=False)
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        self.metrics = Metrics(self.engine)
        self.fingerprint = f"fp_edgellm_{__version__}"
        self._close_lock = threading.Lock()
        self._closed = False
        self._outboxes: dict = {}  # event loop -> its Outbox
        max_n = MAX_CHOICES if self.max_queue is None else max(1, min(self.max_queue, MAX_CHOICES))
        self.limits = dict(max_n=max_n, n_ctx=self.llm.n_ctx, n_vocab=self.llm.n_vocab,
                           models={self.model_id})

    def close_engine(self) -> None:
        """Stop generating: running and waiting requests end as cancelled (their clients get 503)."""
        self.draining = True
        with self._close_lock:
            if not self._closed:
                self._closed = True
                self.engine.close()

    def outbox(self) -> Outbox:
        """The running event loop's Outbox (made at its first request)."""
        loop = asyncio.get_running_loop()
        box = self._outboxes.get(loop)
        if box is None:
            box = self._outboxes[loop] = Outbox(self.engine, loop)
        return box

    def check_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization")
        if not header:
            raise unauthorized("You didn't provide an API key. Provide it in an Authorization header using "
                               "Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), self.api_key.encode()):
            raise unauthorized("Incorrect API key provided.")


def _endpoint(ctx: Context, path: str, handler, open_: bool):
    async def endpoint(request: Request) -> Response:
        try:
            if not open_:
                ctx.check_key(request)
            response = await handler(ctx, request)
        except APIError as exc:
            response = exc.response()
        except ClientDisconnect:  # gone while sending its body: nobody to answer
            response = Response(status_code=400)
        except Exception:  # a bug: logged here, a plain error JSON to the client
            log.exception("error in %s", path)
            response = server_error("The server had an error while processing your request.").response()
        ctx.metrics.request(path, response.status_code)
        return response

    return endpoint


def create_app(ctx: Context) -> Starlette:
    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = (f"Unknown request URL: {request.method} {request.url.path}." if exc.status_code == 404
                   else f"{exc.detail}: {request.method} {request.url.path}.")
        response = APIError(exc.status_code, message, code=code).response()
        ctx.metrics.request("other", exc.status_code)
        return response

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.error("unexpected error on %s: %r", request.url.path, exc)
        return server_error("The server had an error while processing your request.").response()

    routes = [Route(path, _endpoint(ctx, path, handler, open_), methods=[method])
              for method, path, handler, open_ in ROUTES]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: unexpected})
    app.router.redirect_slashes = False  # a path with a trailing slash is unknown (404), not a 307 to follow
    app.state.ctx = ctx
    return app
