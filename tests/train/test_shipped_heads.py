"""The heads shipped for SmolLM2: each loads through the spec registry with a config and tensor
shapes that fit the target, is small fp16, says how it was made, and keeps greedy decoding lossless
at c = 1 and 4."""

import json

import pytest
import torch

from refengine.engine.llm import LLM
from refengine.heads import shipped_head_path, shipped_heads
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.head_checkpoint import head_state_dict, read_head_checkpoint
from refengine.spec_decode.registry import KVLayout, build_network
from refengine.train.evaluate import engine_acceptance
from refengine.train.regenerate import chat_ids
from refengine.train.sharegpt import ChatPrompt
from refengine.train.trainer import METHODS

MAX_BYTES = 20 * 2**20
SHIPPED = sorted(method for target, method in shipped_heads() if target == "smollm2")


def test_lookup_by_name_or_loaded_target(tiny_model):
    assert shipped_head_path("smollm2", "ngram") is None
    assert shipped_head_path(tiny_model, "eagle") is None
    assert shipped_head_path("no-such-model", "eagle") is None
    assert shipped_head_path("../smollm2", "eagle") is None
    # Trained eagle, eagle3, mtp and dflash heads ship for the embedded target (reports/acceptance.md).
    assert set(shipped_heads()) == {("smollm2", m) for m in ("eagle", "eagle3", "mtp", "dflash")}
    assert set(shipped_heads()) <= {("smollm2", m) for m in METHODS}


@pytest.mark.model
def test_lookup_of_the_loaded_embedded_target(smollm2):
    assert shipped_head_path(smollm2, "eagle") == shipped_head_path("smollm2", "eagle") is not None


@pytest.mark.model
@pytest.mark.parametrize("method", SHIPPED)
def test_shipped_head_fits_the_target(smollm2, method):
    folder = shipped_head_path("smollm2", method)
    assert folder is not None
    assert sum(f.stat().st_size for f in folder.iterdir()) < MAX_BYTES
    checkpoint = read_head_checkpoint(folder)
    config = checkpoint.config
    target = smollm2.config
    assert config["hidden_size"] == target.hidden_size and config["vocab_size"] == target.vocab_size
    assert config["training"]["command"].startswith(
        f"refengine train-drafter --target smollm2 --method {method} "
    )
    # COMMAND holds every command that made the head, in order: the training, then any draft vocabulary.
    commands = [config["training"]["command"]] + ([config["draft_vocab"]["command"]] if "draft_vocab" in config else [])
    assert (folder / "COMMAND").read_text().strip().split("\n") == commands
    head = build_network(SpeculativeConfig(method, 4), smollm2, KVLayout(4, 16), checkpoint)
    expected = {head.checkpoint_name(n): t.shape for n, t in head_state_dict(head).items()}
    assert {n: t.shape for n, t in checkpoint.tensors.items()} == expected
    assert all(t.dtype == torch.float16 for n, t in checkpoint.tensors.items() if n != "d2t")
    if method == "eagle3":
        aux = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        assert all(2 <= i < target.num_hidden_layers for i in aux)
        # Its draft vocabulary (draft_vocab.py): its own lm_head over the most frequent training-split tokens.
        assert config["draft_vocab"]["command"].startswith(f"refengine draft-vocab --head refengine/heads/smollm2/{method} ")
        assert head.lm_head is not None and head.lm_head.weight.shape[0] == config["draft_vocab_size"] < target.vocab_size
    if method == "dflash":
        ids = config["dflash_config"]["target_layer_ids"]
        assert all(0 <= i < target.num_hidden_layers for i in ids) and head.capture_layers == tuple(ids)
        assert head.mask_token_id == config["dflash_config"]["mask_token_id"]


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at", "Once upon a time"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
ENGINE = dict(max_model_len=128, num_blocks=64)


@pytest.fixture(scope="module")
def baseline(smollm2):
    return [o.token_ids for o in LLM(smollm2, **ENGINE, max_num_seqs=4).generate(PROMPTS, GREEDY)]


@pytest.mark.model
@pytest.mark.parametrize("max_num_seqs", [1, 4])
@pytest.mark.parametrize("method", SHIPPED)
def test_shipped_head_is_lossless(smollm2, baseline, method, max_num_seqs):
    spec = SpeculativeConfig(method, 4, model=str(shipped_head_path(smollm2, method)))
    llm = LLM(smollm2, **ENGINE, max_num_seqs=max_num_seqs, speculative_config=spec)
    assert not llm.engine.core.runner.drafter.random_init
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baseline
    assert llm.engine.core.scheduler.spec_decoding_stats.num_accepted_tokens > 0


def test_commands_are_recorded():
    for (_, method), folder in shipped_heads().items():
        training = json.loads((folder / "config.json").read_text())["training"]
        assert f"--method {method}" in training["command"] and "--seed" in training["command"]


# The opening turn of held-out ShareGPT conversation THAybyi (reports/acceptance.md's basis): no head trained on it.
HELD_OUT_PROMPT = "Can you explain the fourth dimension to a second grader?"
# Accepted drafts over verify steps of the shipped eagle3 head at k = 4 on it, greedy, 24 new tokens, the
# engine's default (batch-invariant) numerics: a pinned figure, so a changed head or drafting path shows.
EAGLE3_PINNED = (8, 16)


@pytest.mark.model
def test_shipped_eagle3_accepts_its_pinned_figure_on_a_held_out_prompt(smollm2):
    spec = SpeculativeConfig("eagle3", 4, model=str(shipped_head_path("smollm2", "eagle3")))
    llm = LLM(smollm2, **ENGINE, max_num_seqs=1, speculative_config=spec)
    prompt = chat_ids(smollm2, ChatPrompt("THAybyi", 0, HELD_OUT_PROMPT))
    acceptance = engine_acceptance(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=24))
    accepted = round((acceptance.mean_accepted_length - 1) * acceptance.num_steps)
    assert (accepted, acceptance.num_steps) == EAGLE3_PINNED
