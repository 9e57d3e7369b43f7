"""Errors as OpenAI sends them: a status code and {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from starlette.responses import JSONResponse

RETRY_AFTER_SECONDS = 1  # what a client told "queue full" or "shutting down" should wait


class APIError(Exception):
    """An error to answer with: `status`, OpenAI's `type`, the offending `param` and a `code`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(param: str | None, message: str, code: str | None = None) -> APIError:
    """400: a parameter (named) is missing, of the wrong type or out of range."""
    return APIError(400, message, param=param, code=code or ("invalid_value" if param else None))


def unauthorized(message: str) -> APIError:
    return APIError(401, message, code="invalid_api_key")


def model_not_found(model: str) -> APIError:
    return APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


def too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than {limit} bytes.", code="request_too_large")


def queue_full(detail: str) -> APIError:
    return APIError(429, f"The server is busy ({detail}). Retry after {RETRY_AFTER_SECONDS} s.",
                    type="rate_limit_error", code="queue_full",
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def shutting_down() -> APIError:
    return APIError(503, "The server is shutting down.", type="server_error", code="shutting_down",
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def server_error(message: str) -> APIError:
    return APIError(500, message, type="server_error", code="internal_error")
