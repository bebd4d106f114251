"""`vllm bench serve`'s flag names that `ladder run` spells differently, each with its spelling here, so that a
vLLM user's habit gets our flag rather than click's nearest name (--num-prompts is not --num-prefixes)."""

# vLLM's flag -> what it is here (names as in vLLM 0.33.0's serve.py and datasets.py)
OURS = {
    "--num-prompts": "--prompts-per-rung (or --prompts-per-concurrency K for K·c a rung)",
    "--dataset-name": "--dataset NAME",
    "--dataset-path": "--dataset NAME:PATH",
    "--random-input-len": "--input-len",
    "--random-output-len": "--output-len",
    "--sharegpt-output-len": "--output-len",
    "--random-prefix-len": "--prefix-len",
    "--random-range-ratio": "--range-ratio",
    "--num-warmups": "--warmup",
    "--percentile-metrics": "not needed (TTFT, TPOT, ITL and E2E are always reported; --metric-percentiles "
                            "picks the percentiles)",
    "--save-result": "--out DIR (every run is saved, each request included)",
    "--save-detailed": "--out DIR (every run is saved, each request included)",
    "--result-dir": "--out DIR",
    "--result-filename": "--out DIR",
    "--host": "--base-url http://HOST:PORT",
    "--port": "--base-url http://HOST:PORT",
    "--endpoint": "--backend openai (/v1/completions) or openai-chat (/v1/chat/completions)",
    "--ready-check-timeout-sec": "--serve-timeout",
    "--num-runs": "--repeats",
}


def hint(option: str) -> str | None:
    """The one-line error for a vLLM flag this command does not have, or None for any other unknown flag."""
    ours = OURS.get(option.split("=", 1)[0])
    return None if ours is None else f"no such option {option}: vllm bench serve's {option} is {ours} here"


def max_concurrency(n: int) -> str:
    """--max-concurrency without --request-rate: vLLM's meaning (a closed loop, every request due at once)."""
    return (f"--max-concurrency caps --request-rate (an open loop) here; in vllm bench serve --max-concurrency {n} "
            f"alone sends every request at once with {n} in flight, a closed loop: a closed loop of {n} in flight "
            f"is --c {n} here")
