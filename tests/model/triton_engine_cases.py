"""The engine on the Triton attention kernels: tiny-qwen3 with speculation on emits, token for token, what it
emits with speculation off (invariant 52 of docs/invariants.md, at the oracle's level). Run by test_triton_attention.py under
Triton's interpreter on the CPU (TRITON_INTERPRET=1 must be set before triton is imported); on a GPU,
`make oracle-gpu` runs the whole matrix on the compiled kernels.
"""

import dataclasses

import pytest

pytest.importorskip("triton")

from refengine.model import attention  # noqa: E402
from refengine.oracle.arms import Arm  # noqa: E402
from refengine.oracle.judge import judge  # noqa: E402
from refengine.oracle.prompts import token_prompts  # noqa: E402
from refengine.oracle.run import Workload, run_arm  # noqa: E402
from refengine.oracle.runner import resolve_model  # noqa: E402

BLOCK_SIZE = 4


def test_spec_on_emits_spec_offs_tokens_on_the_triton_kernels():
    """A teacher proposes the baseline's continuation, so every verify step's k + 1 rows are all used, and a
    forced preemption re-prefills past verified drafts: a row's bits must not depend on whether it was
    decoded, verified beside drafts or prefilled."""
    model = resolve_model("tiny-qwen3")
    prompts = tuple(map(tuple, token_prompts(model.config.vocab_size, 2, seed=0)))
    w = Workload(prompts, 8, 2, 0.0, 0, 3)  # greedy: seeded draws are keyed by position (oracle.md)
    before = attention.ATTENTION_CALLS["triton"]
    baseline = run_arm(model, Arm("sync", None, False, False, False), w, BLOCK_SIZE, attention_backend="triton")
    w = dataclasses.replace(w, teacher_outputs=tuple(map(tuple, baseline.tokens)))
    arm = Arm("async-d2", "teacher", False, True, False)
    result = run_arm(model, arm, w, BLOCK_SIZE, attention_backend="triton")
    assert attention.ATTENTION_CALLS["triton"] > before and attention.ATTENTION_CALLS["reference"] == 0
    assert result.num_accepted_tokens == result.num_draft_tokens > 0
    assert result.counts.num_preemptions_after_drafts > 0
    verdict = judge(result, baseline, None)
    assert verdict.label == "IDENTICAL", verdict
