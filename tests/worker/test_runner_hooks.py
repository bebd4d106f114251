"""The testing and study hooks live outside the production runner: an engine built without them drives
the ModelRunner itself, with the real accept rule; fault injection, step recording and synthetic
acceptance come as wrappers and a swapped rule, and each still does its job."""

import pytest
import torch

from refengine.engine.arg_utils import EngineArgs
from refengine.engine.engine_args import build_engine
from refengine.engine.llm import LLM
from refengine.model.tiny import build_tiny_model
from refengine.sample import rng
from refengine.sampling_params import SamplingParams, StructuredOutputsParams
from refengine.worker.fault_injection import FaultInjectingRunner, InjectedFault
from refengine.worker.step_recorder import StepRecorder
from refengine.worker.synthetic_acceptance import SyntheticAcceptance


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model("qwen3", seed=1)


def test_the_production_engine_carries_no_hook(tiny):
    engine = build_engine(EngineArgs(model=tiny, num_blocks=16, max_model_len=64))
    assert engine.core.runner is engine.runner
    assert engine.runner.accept is None  # the rejection sampler's own rule
    assert engine.step_recorder is None
    engine.core.shutdown()


def test_hooks_wrap_the_runner_when_asked(tiny):
    engine = build_engine(
        EngineArgs(model=tiny, num_blocks=16, max_model_len=64, fault_after_steps=5, record_steps=True,
                   synthetic_acceptance_rate=0.5)
    )
    assert isinstance(engine.core.runner, FaultInjectingRunner)
    assert isinstance(engine.core.runner.runner, StepRecorder) and engine.core.runner.runner is engine.step_recorder
    assert engine.step_recorder.runner is engine.runner
    assert engine.runner.accept == SyntheticAcceptance(0.5)
    engine.core.shutdown()


@pytest.mark.parametrize("after_steps", [0, 3])
def test_the_fault_fires_on_the_step_after_the_last_allowed(tiny, after_steps):
    """The runner itself executes exactly `after_steps` steps; the next one raises the named fault."""
    llm = LLM(tiny, num_blocks=32, block_size=4, max_model_len=64, fault_after_steps=after_steps)
    with pytest.raises(InjectedFault, match=f"injected fault at runner step {after_steps + 1}"):
        llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    assert llm.engine.runner.num_steps == after_steps


@pytest.mark.parametrize("hook", [{"fault_after_steps": 1000}, {"record_steps": True}], ids=["fault", "record"])
def test_wrapped_runners_pass_the_grammar_masks_through(tiny, hook):
    """A wrapper hands the engine core's grammar bitmasks on to the runner: the wrapped engine's output is
    the unwrapped one's, and each text is one of the choices (the random tiny model ends nowhere near one
    of them unmasked)."""
    choices = ["alpha", "beta", "gamma delta"]
    params = SamplingParams(temperature=0.0, max_tokens=32, structured_outputs=StructuredOutputsParams(choice=choices))
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    plain, wrapped = (
        LLM(tiny, num_blocks=32, block_size=4, max_model_len=64, **kw).generate(prompts, params) for kw in ({}, hook)
    )
    assert [o.text for o in wrapped] == [o.text for o in plain]
    assert all(o.text in choices for o in wrapped), [o.text for o in wrapped]


def test_synthetic_acceptance_accepts_a_prefix_and_never_a_placeholder():
    padded = torch.tensor([(4, 5, 6), (4, -1, 6)])
    keys, positions = torch.tensor([rng.key_word(7)] * 2), torch.tensor([2, 2])
    assert SyntheticAcceptance(1.0)(padded, padded, keys, positions).tolist() == [3, 1]
    assert SyntheticAcceptance(0.0)(padded, padded, keys, positions).tolist() == [0, 0]


# Counts captured from the per-row implementation (one rng.uniform per draft) before it was batched: the
# batched hook must accept exactly the same drafts for the same keys, positions and rates. The keys cover
# both 32-bit halves (2**63 + ..., 2**64 - 1), the drafts a placeholder, token 0, and a row with none.
PINNED_KEYS = (3, 7, 2**63 + 12345, 2**64 - 1, 0, 987654321987)
PINNED_LENGTHS = (10, 11, 500, 3, 1, 77)
PINNED_DRAFTS = {"a": (4, 4, 4, 4), "b": (9, 9, 9, 9), "c": (1, 2, 3, 4), "d": (5, -1, 5, 5), "e": (0, 0), "f": ()}


@pytest.mark.parametrize(
    ("rate", "expected"),
    [
        (0.3, [0, 0, 0, 0, 0, 0]),
        (0.5, [1, 3, 0, 0, 1, 0]),
        (0.6, [3, 3, 0, 0, 1, 0]),
        (0.7, [3, 3, 0, 1, 1, 0]),
        (0.8, [3, 3, 0, 1, 2, 0]),
        (0.9, [3, 3, 4, 1, 2, 0]),
        (1.0, [4, 4, 4, 1, 2, 0]),
    ],
)
def test_synthetic_acceptance_batched_counts_are_the_per_row_ones(rate, expected):
    keys = torch.tensor([rng.key_word(key) for key in PINNED_KEYS])
    positions = torch.tensor(PINNED_LENGTHS)
    padded = torch.tensor([[*d, *[-1] * (4 - len(d))] for d in PINNED_DRAFTS.values()])
    assert SyntheticAcceptance(rate)(padded, padded, keys, positions).tolist() == expected
