"""What the routes of `mdlm serve` share: a JSON body read within the server's size limit, and
an error (a refused request, or a job that failed) as OpenAI's error response."""

from __future__ import annotations

import json
import sys
import traceback

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..engine.errors import EngineError
from ..errors import MdlmError
from .jobs import Cancelled
from .schema import ApiError


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def api_error(exc: BaseException, timeout_s: float) -> ApiError:
    """A failed job's answer: the time limit (504), a client gone (499), a user mistake the
    engine caught (400), anything else a 500 whose traceback goes to the server's log."""
    if isinstance(exc, Cancelled):
        if exc.reason == "timeout":
            return ApiError(504, "the request ran past the server's time limit of "
                                 f"{timeout_s:g} s", code="timeout", kind="timeout_error")
        if exc.reason == "disconnect":
            return ApiError(499, "the client disconnected", code="client_closed_request")
        return ApiError(503, "the server is shutting down", code="unavailable",
                        kind="server_error")
    if isinstance(exc, MdlmError | EngineError):
        return ApiError(400, str(exc))
    traceback.print_exception(exc, file=sys.stderr)
    return ApiError(500, f"internal error ({type(exc).__name__}): {exc}", kind="server_error",
                    code="internal_error")


async def json_body(request: Request, limit: int) -> dict:
    too_large = ApiError(413, f"the body is larger than the server's limit of {limit} bytes",
                         code="request_too_large")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as e:
        raise ApiError(400, f"the body is not valid JSON ({e})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    return body
