"""Greedy speculative decoding is lossless for every method: spec-on tokens equal spec-off tokens,
16 prompts at max_num_seqs 1, 2, 4 and 8, with randomly initialised heads (their drafts are mostly
wrong, so rejection and rollback run on nearly every step). And a request's drafts never depend on
what else is in the batch: its per-step drafts at every concurrency equal those at max_num_seqs 1."""

import random

import pytest

from refengine.engine.llm import LLM
from refengine.model import build_tiny_model, save_hf_folder
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig


def _prompt(i: int) -> list[int]:
    rng = random.Random(2000 + i)
    # Repeats give prompt lookup something to find.
    base = [rng.randrange(3, 300) for _ in range(3 + i % 5)]
    return (base * 4)[: 5 + 2 * i]


PROMPTS = [_prompt(i) for i in range(16)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
ENGINE = dict(num_blocks=256, block_size=4, max_model_len=96)


@pytest.fixture(scope="module")
def baseline(tiny4):
    return [o.token_ids for o in LLM(tiny4, **ENGINE).generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def separate_draft_model(tmp_path_factory):
    """A different, smaller model with the target's vocabulary, loaded by path."""
    return str(save_hf_folder(build_tiny_model("llama", seed=9), tmp_path_factory.mktemp("draft")))


METHODS = {
    "ngram": dict(prompt_lookup_min=1, prompt_lookup_max=3),
    "self-draft": dict(num_draft_layers=1),
    "draft-model": {},
    "eagle": {},
    "eagle3": {},
    "mtp": {},
    "dflash": {},
}


def _spec(name: str, draft_model_path: str) -> SpeculativeConfig:
    method = {"self-draft": "draft_model", "draft-model": "draft_model"}.get(name, name)
    extra = dict(METHODS[name], model=draft_model_path) if name == "draft-model" else METHODS[name]
    return SpeculativeConfig(method, 3, **extra)


def _run(tiny4, name, draft_model_path, max_num_seqs):
    spec = _spec(name, draft_model_path)
    llm = LLM(tiny4, **ENGINE, max_num_seqs=max_num_seqs, speculative_config=spec, record_steps=True)
    outs = llm.generate(PROMPTS, GREEDY)
    stats = llm.engine.core.scheduler.spec_decoding_stats
    assert stats.num_draft_tokens > 0  # drafts were verified
    # The per-step records the oracle compares add up to the scheduler's acceptance count.
    assert sum(r.num_accepted for o in outs for r in o.steps) == stats.num_accepted_tokens
    return [o.token_ids for o in outs], [o.steps for o in outs]


@pytest.fixture(scope="module")
def alone(tiny4, separate_draft_model):
    """Per method: outputs and per-step records at max_num_seqs 1, computed once."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = _run(tiny4, name, separate_draft_model, 1)
        return cache[name]

    return get


@pytest.mark.parametrize("max_num_seqs", [1, 2, 4, 8])
@pytest.mark.parametrize("name", list(METHODS))
def test_spec_on_equals_spec_off(tiny4, baseline, separate_draft_model, alone, name, max_num_seqs):
    solo_tokens, solo_steps = alone(name)
    tokens, steps = (
        (solo_tokens, solo_steps)
        if max_num_seqs == 1
        else _run(tiny4, name, separate_draft_model, max_num_seqs)
    )
    assert tokens == baseline
    assert steps == solo_steps
