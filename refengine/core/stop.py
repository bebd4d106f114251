"""Stop conditions, checked after each token appended to a request."""

from collections.abc import Callable

from refengine.request import Request, RequestStatus

# Called after each token appended to a request with stop strings, once min_tokens is reached; returns the
# stop string that the output text now contains, or None. The engine implements it with its detokenizer.
StopChecker = Callable[[Request], str | None]


def check_stop(
    request: Request, token_id: int, max_model_len: int, stop_checker: StopChecker | None
) -> RequestStatus | None:
    """The finished status that `token_id`, just appended, gives the request, or None. Records the stop
    token or string in request.stop_reason. eos, stop ids and stop strings wait for min_tokens."""
    params = request.sampling_params
    if request.num_output_tokens >= params.min_tokens:
        if token_id == request.eos_token_id and not params.ignore_eos:
            return RequestStatus.FINISHED_STOPPED
        if token_id in params.stop_token_ids:
            request.stop_reason = token_id
            return RequestStatus.FINISHED_STOPPED
        if params.stop and stop_checker is not None and (matched := stop_checker(request)) is not None:
            request.stop_reason = matched
            return RequestStatus.FINISHED_STOPPED
    if request.num_output_tokens >= params.max_tokens or request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    return None
