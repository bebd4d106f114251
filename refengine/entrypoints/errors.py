"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with a matching status."""

from http import HTTPStatus

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from refengine.entrypoints.responses import ErrorInfo, ErrorResponse

# OpenAI names a client mistake "invalid_request_error" whatever the status; the code tells them apart.
_TYPE_BY_STATUS = {401: "authentication_error", 500: "server_error", 503: "server_error"}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code or HTTPStatus(status).phrase.lower().replace(" ", "_")
        self.headers = headers or {}

    def body(self) -> ErrorResponse:
        error_type = _TYPE_BY_STATUS.get(self.status, "invalid_request_error")
        return ErrorResponse(
            error=ErrorInfo(message=self.message, type=error_type, param=self.param, code=self.code)
        )

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(
            self.body().model_dump(), status_code=self.status, headers={**self.headers, **(headers or {})}
        )


def engine_dead(reason: str) -> APIError:
    return APIError(500, f"engine is dead: {reason}", code="engine_dead")


def param_path(loc: tuple[int | str, ...]) -> str | None:
    """("messages", 0, "content") -> "messages.[0].content", the way OpenAI names nested params."""
    return ".".join(f"[{part}]" if isinstance(part, int) else part for part in loc) or None


def from_validation_error(exc: ValidationError) -> APIError:
    """The first problem, with its field as `param`. Pydantic prefixes custom messages with
    "Value error, ", which reads badly to API users, so it is removed."""
    first = exc.errors(include_url=False)[0]
    param = param_path(tuple(first["loc"]))
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "json_invalid":
        return APIError(400, f"malformed JSON body: {message}", code="invalid_json")
    if first["type"] == "model_type" and param is None:
        return APIError(400, "the request body must be a JSON object", code="invalid_json")
    if first["type"] not in ("missing", "value_error") and "input" in first:
        message = f"{message} (got {_short(first['input'])})"
    return APIError(400, f"{param}: {message}" if param else message, param=param, code="invalid_value")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
