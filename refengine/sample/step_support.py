"""What the one-graph uniform verify step (worker/spec_step_graphs.py) honours, per SamplingParams field:
the one declaration that the runner's eligibility check reads and the step-path tests check against.

The step verifies and drafts on the device with the rows' temperature and key (greedy, or seeded without
top-k and top-p); a request that sets a field the step leaves out must go the general way, or the field
is silently ignored while every token still looks plausible. tests/worker/test_step_paths.py fails when
SamplingParams gains a field that is not declared here.
"""

import dataclasses
from enum import Enum

from refengine.sampling_params import SamplingParams


class Honours(Enum):
    ALWAYS = "always"  # the step applies it, or no step reads it (the scheduler or the output processor does)
    WHEN_GREEDY = "when greedy"  # left out, which only a greedy row (an argmax whatever its value) may be
    NEVER = "never"  # left out: a request with anything but the default goes the general way


UNIFORM_STEP_HONOURS: dict[str, Honours] = {
    "temperature": Honours.ALWAYS,
    "top_k": Honours.WHEN_GREEDY,
    "top_p": Honours.WHEN_GREEDY,
    "seed": Honours.ALWAYS,  # the rows' key words are staged with their temperature
    "max_tokens": Honours.ALWAYS,  # the scheduler's
    "min_tokens": Honours.NEVER,  # its eos and stop-token masks are the general path's
    "stop": Honours.ALWAYS,  # the output processor's
    "stop_token_ids": Honours.ALWAYS,  # the scheduler's (masked before min_tokens, which is NEVER)
    "ignore_eos": Honours.ALWAYS,  # the scheduler's
    "bad_words": Honours.NEVER,  # drafts judged and rows masked on the host
    "logprobs": Honours.NEVER,  # read back from the general path's logits
    "bad_words_token_ids": Honours.NEVER,
    "structured_outputs": Honours.NEVER,  # grammar masks and draft overrides
}

_DEFAULTS = SamplingParams()


def uniform_step_supports(params: SamplingParams) -> bool:
    """Whether a request with `params` may take the uniform step: every field the step leaves out is at
    its default (or, for those a greedy row ignores, the request is greedy). An undeclared field refuses."""
    greedy = params.temperature == 0.0
    for f in dataclasses.fields(params):
        honours = UNIFORM_STEP_HONOURS.get(f.name, Honours.NEVER)
        if honours is Honours.ALWAYS or (honours is Honours.WHEN_GREEDY and greedy):
            continue
        if getattr(params, f.name) != getattr(_DEFAULTS, f.name):
            return False
    return True
