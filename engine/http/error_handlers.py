"""The HTTP API's errors as answers: one JSON body for every error (TEI's, with Cohere's `message`
beside it: engine.http.models.ApiError), and each exception the handlers may raise with its answer
(EXCEPTION_HANDLERS: 422 naming the field, the framework's 404 and 405, 429 with Retry-After, 504,
503), never a traceback."""

from __future__ import annotations

import asyncio
import json

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.errors import InputError, PruneError
from engine.http.models import ApiError
from engine.http.state import Busy


def error_response(kind: ApiError, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The answer of error `kind` with `message` (TEI's body, Cohere's `message` beside it)."""
    return JSONResponse(kind.body(message), status_code=kind.status, headers=headers)


async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422: the field at fault, or why the body is not JSON."""
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    if first.get("type") == "unknown_field":  # engine.http.models.StrictRequest: it names the field
        return error_response(
            ApiError.INVALID, (f"{where}: " if where else "") + first.get("msg", "unknown field")
        )
    if first.get("type") == "json_invalid":
        why, at = first.get("ctx", {}).get("error", "invalid"), first.get("loc", ("", "?"))[-1]
        return error_response(ApiError.INVALID, f"the body is not valid JSON ({why} at character {at})")
    if isinstance(exc.body, (bytes, bytearray)) and tuple(first.get("loc", ())) == ("body",):
        return error_response(ApiError.INVALID, not_json_message(request.headers.get("content-type")))
    return error_response(ApiError.INVALID, f"{where or 'body'}: {first.get('msg', 'invalid')}")


def not_json_message(content_type: str | None) -> str:
    """What a body not read as JSON, for its Content-Type (curl -d sends a form's), is told."""
    sent = (
        f"this request's Content-Type is {content_type}"
        if content_type
        else "this request has no Content-Type"
    )
    return (
        f"the body must be JSON sent with Content-Type: application/json ({sent}; "
        "with curl, add -H 'Content-Type: application/json')"
    )


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """A status the framework raised (404, 405, an unreadable body) as the API's error."""
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    if exc.status_code == 400 and "parsing the body" in detail:
        detail = "the body cannot be read as JSON (is it UTF-8?)"
    return error_response(ApiError.of_status(exc.status_code), detail)


async def busy(request: Request, exc: Busy) -> JSONResponse:
    """429 with Retry-After."""
    return error_response(ApiError.OVERLOADED, str(exc), headers={"Retry-After": "1"})


async def late(request: Request, exc: asyncio.TimeoutError) -> JSONResponse:
    """504: past the request's deadline."""
    return error_response(
        ApiError.TIMEOUT, f"no answer within {request.app.state.api.config.request_timeout:g} s"
    )


async def bad_input(request: Request, exc: InputError) -> JSONResponse:
    """422: the engine's input limits."""
    return error_response(ApiError.INVALID, str(exc))


async def engine_failed(request: Request, exc: PruneError) -> JSONResponse:
    """503: the engine failed."""
    return error_response(ApiError.BACKEND, str(exc))


#: each exception the handlers may raise, and its answer
EXCEPTION_HANDLERS = {
    RequestValidationError: invalid,
    StarletteHTTPException: http_error,
    Busy: busy,
    asyncio.TimeoutError: late,
    InputError: bad_input,
    PruneError: engine_failed,
}
