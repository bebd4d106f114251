"""SpeculativeConfig: parsed from the JSON that vLLM's --speculative-config takes."""

import json
import os
from dataclasses import dataclass, field, fields

# The method truth table, kept as data so that a new method is one line here plus an oracle arm.
# True: the drafter runs inside the runner on its own state and always proposes exactly k drafts
# (padding with -1), so the scheduler can ship -1 placeholders and async scheduling stays on.
# False: ngram reads the committed token lists on the host, which do not exist yet while a frame is
# in flight; draft_model was refused under async in the engine this project mirrors. (vLLM 0.33
# does allow draft_model under async; extending that here means flipping this entry and adding the
# matching oracle arm.)
ASYNC_SCHEDULING_COMPATIBLE: dict[str, bool] = {
    "mtp": True,
    "eagle": True,
    "eagle3": True,
    "dflash": True,
    "ngram": False,
    "draft_model": False,
}

# vLLM normalises its per-architecture MTP names to "mtp"; accept the common ones the same way.
METHOD_ALIASES: dict[str, str] = {
    "deepseek_mtp": "mtp",
    "qwen3_next_mtp": "mtp",
    "qwen3_5_mtp": "mtp",
    "mimo_mtp": "mtp",
    "glm4_moe_mtp": "mtp",
    "ernie_mtp": "mtp",
}

ASYNC_ENV_VAR = "REFENGINE_ASYNC_SCHEDULING"


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    model: str | None = None
    # draft_model self-draft: the target's first layers plus its final norm and lm_head.
    num_draft_layers: int | None = None
    # ngram prompt lookup window.
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    # dflash: drafts per step = block_size - 1; the query block is [t, mask x k].
    block_size: int | None = None
    mask_token_id: int | None = None
    target_layer_ids: tuple[int, ...] | None = None
    # vLLM's adaptive verification: each step verifies 0..k drafts per request, by a cost table measured
    # at start-up and each request's acceptance by position (spec_decode/adaptive_verification.py).
    enable_adaptive_verification: bool = False
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        method = METHOD_ALIASES.get(self.method, self.method)
        object.__setattr__(self, "method", method)
        if method not in ASYNC_SCHEDULING_COMPATIBLE:
            known = ", ".join(sorted(ASYNC_SCHEDULING_COMPATIBLE))
            raise ValueError(f"unknown speculative method {self.method!r}; known methods: {known}")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 64:
            raise ValueError(f"num_speculative_tokens must be an integer in [1, 64], got {k!r}")
        if self.num_draft_layers is not None and (
            not isinstance(self.num_draft_layers, int) or self.num_draft_layers < 1
        ):
            raise ValueError(f"num_draft_layers must be a positive integer, got {self.num_draft_layers!r}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(
                f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {self.prompt_lookup_min}, {self.prompt_lookup_max}"
            )
        if self.block_size is not None:
            if method != "dflash":
                raise ValueError(f"block_size applies to dflash only, not to {method!r}")
            if self.block_size != k + 1:
                raise ValueError(
                    f"dflash block_size must equal num_speculative_tokens + 1 ({k + 1}), got {self.block_size}"
                )
        if self.target_layer_ids is not None:
            object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
            if not self.target_layer_ids or any(
                not isinstance(i, int) or i < 0 for i in self.target_layer_ids
            ):
                raise ValueError(
                    f"target_layer_ids must be non-negative layer indices, got {self.target_layer_ids!r}"
                )
        if not isinstance(self.enable_adaptive_verification, bool):
            raise ValueError(f"enable_adaptive_verification must be true or false, got {self.enable_adaptive_verification!r}")
        if method in ("ngram",) and self.model is not None:
            raise ValueError("ngram takes no model")

    @classmethod
    def from_json(cls, text: str) -> "SpeculativeConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"--speculative-config is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ValueError("--speculative-config must be a JSON object")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict) -> "SpeculativeConfig":
        known = {f.name for f in fields(cls)} - {"extra"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown speculative-config keys: {', '.join(unknown)}")
        if "method" not in data or "num_speculative_tokens" not in data:
            raise ValueError("speculative-config needs 'method' and 'num_speculative_tokens'")
        return cls(**data)

    @property
    def num_lookahead_slots(self) -> int:
        """KV slots reserved beyond the scheduled tokens: k, or k + 1 for dflash's query block."""
        return self.num_speculative_tokens + (1 if self.method == "dflash" else 0)

    def async_scheduling_compatible(self) -> bool:
        """Whether async scheduling may stay on with this method (see ASYNC_SCHEDULING_COMPATIBLE)."""
        return ASYNC_SCHEDULING_COMPATIBLE[self.method]


@dataclass(frozen=True)
class AsyncResolution:
    enabled: bool
    source: str  # "flag", "env" or "auto"
    reason: str


def resolve_async_scheduling(
    flag: bool | None, spec: SpeculativeConfig | None, environ: dict[str, str] | None = None
) -> AsyncResolution:
    """Precedence: explicit flag > REFENGINE_ASYNC_SCHEDULING > automatic (on where compatible).
    Invariant 28 in docs/invariants.md: asking for async with a method that forces sync is refused."""
    env = (os.environ if environ is None else environ).get(ASYNC_ENV_VAR)
    if flag is not None:
        requested, source = flag, "flag"
    elif env is not None and env != "":
        if env not in ("0", "1"):
            raise ValueError(f"{ASYNC_ENV_VAR} must be 0 or 1, got {env!r}")
        requested, source = env == "1", "env"
    else:
        requested, source = None, "auto"
    compatible = spec is None or spec.async_scheduling_compatible()
    if requested and not compatible:
        raise ValueError(
            f"async scheduling was requested ({source}) but speculative method {spec.method!r} "
            "needs synchronous scheduling (its drafter reads committed tokens on the host)"
        )
    if requested is None:
        method = "no speculative decoding" if spec is None else f"method {spec.method!r}"
        if compatible:
            return AsyncResolution(True, source, f"on: {method} is compatible")
        return AsyncResolution(False, source, f"off: {method} forces synchronous scheduling")
    return AsyncResolution(requested, source, f"{'on' if requested else 'off'}: set by {source}")
