"""The offline acceptance check that training records counts what the engine counts: on the same
prompt and the same target tokens, the engine's verify steps and the offline walk over the batched
training forward's drafts are the same steps, with the same accepted drafts."""

import pytest

from refengine.engine.llm import LLM
from refengine.heads import shipped_head_path
from refengine.model import Numerics
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.head_checkpoint import read_head_checkpoint
from refengine.spec_decode.registry import KVLayout, build_network
from refengine.train.evaluate import engine_acceptance, loop_steps, offline_acceptance
from refengine.train.regenerate import Sequences, chat_ids, with_features
from refengine.train.sharegpt import ChatPrompt

K = 4
NEW_TOKENS = 24
# Opening turns of held-out ShareGPT conversations (reports/acceptance.md's basis): no head trained on them.
PROMPTS = [
    ChatPrompt("THAybyi", 0, "Can you explain the fourth dimension to a second grader?"),
]


def test_loop_steps_move_on_by_the_accepted_drafts_and_the_bonus_token():
    runs = [0, 2, 0, 0, 4, 1, 0, 0, 0, 3]
    # Anchor 1 accepts 2 (next 4), 4 accepts 4 (next 9), 9 accepts 3.
    assert loop_steps(runs, 1, 9) == [2, 4, 3]
    assert loop_steps(runs, 2, 8) == [0, 0, 4]


@pytest.mark.model
@pytest.mark.parametrize("method", ["eagle3", "dflash"])
def test_offline_acceptance_equals_the_engines_on_the_same_tokens(smollm2, method):
    prompts = [chat_ids(smollm2, p) for p in PROMPTS]
    folder = shipped_head_path("smollm2", method)
    spec = SpeculativeConfig(method, K, model=str(folder))
    llm = LLM(smollm2, max_model_len=256, num_blocks=64, max_num_seqs=1, speculative_config=spec)
    engine = engine_acceptance(llm, prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS))
    # The offline walk's last anchor is the engine's last step's (the reply's next-to-last token), and
    # its drafts are judged against the K target tokens after it: the reply runs K - 1 tokens further.
    longer = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS + K - 1, ignore_eos=True)
    replies = [
        list(o.token_ids) for o in LLM(smollm2, max_model_len=256, num_blocks=64).generate(prompts, longer)
    ]
    seqs = Sequences.of([(p + r, len(p)) for p, r in zip(prompts, replies, strict=True)])
    # The same weights as the engine's head, on the trainer's (batched, differentiable) numerics.
    head = build_network(spec, smollm2, KVLayout(4, 16), read_head_checkpoint(folder), numerics=Numerics.FAST)
    offline = offline_acceptance(head, with_features(smollm2, seqs, head.capture_layers), K)
    assert engine.mean_accepted_length > 1.2  # the heads accept: a walk of rejections proves nothing
    assert (offline.num_steps, offline.per_position) == (engine.num_steps, engine.per_position)
