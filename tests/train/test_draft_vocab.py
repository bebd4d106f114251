"""`refengine draft-vocab`: an EAGLE3 head gets its own lm_head over the training split's most frequent
tokens (the target's rows) and a d2t map, which the engine loads and drafts from; held-out
conversations contribute nothing, and bad input is a one-line error that leaves the head as it was."""

import json

import pytest
import torch
from click.testing import CliRunner

from refengine.cli import main
from refengine.engine.llm import LLM
from refengine.model.loader import load_model
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.head_checkpoint import read_head_checkpoint, save_head
from refengine.spec_decode.registry import KVLayout, build_network, build_proposer
from refengine.train.draft_vocab import most_frequent, without_draft_vocab
from refengine.train.sharegpt import is_held_out

LAYOUT = KVLayout(num_blocks=32, block_size=4)
TARGET = "tiny-llama"  # its tokenizer is byte-level: one token per character here


@pytest.fixture(scope="module")
def target():
    return load_model(TARGET)


def _conversation(held_out: bool) -> str:
    return next(f"c{i}" for i in range(1000) if is_held_out(f"c{i}") == held_out)


@pytest.fixture()
def sharegpt(tmp_path):
    """Training-split turns where 'e' > 'd' > 'c' > 'b' > 'a' by count; a held-out one of 'z's only."""
    train, held = _conversation(False), _conversation(True)
    records = [
        {"id": f"{train}_0", "conversations": [{"from": "human", "value": "eeeeeddddcccbba"},
                                               {"from": "gpt", "value": "eeeeedddd"}]},
        {"id": f"{train}_1", "conversations": [{"from": "human", "value": "ccbb"}]},
        {"id": f"{held}_0", "conversations": [{"from": "human", "value": "z" * 100}]},
        {"id": "no-turns"},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(records))
    return path


@pytest.fixture()
def head(target, tmp_path):
    network = build_network(SpeculativeConfig("eagle3", 3), target, LAYOUT)
    aux = list(network.aux_layer_ids)
    config = {"model_type": "eagle3", "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux}}
    return save_head(network, config, tmp_path / "head", half=True)


def _run(*args):
    return CliRunner().invoke(main, ["draft-vocab", *map(str, args)])


def _token(target, char: str) -> int:
    (token,) = target.tokenizer.encode(char, add_special_tokens=False)
    return token


def test_most_frequent_breaks_ties_by_id_and_drops_unseen():
    counts = torch.tensor([0, 5, 3, 5, 0, 3, 1])
    assert most_frequent(counts, 3).tolist() == [1, 2, 3]
    assert most_frequent(counts, 10).tolist() == [1, 2, 3, 5, 6]


def test_head_drafts_from_the_training_splits_most_frequent_tokens(target, head, sharegpt):
    result = _run("--head", head, "--target", TARGET, "--size", 3, "--source", sharegpt)
    assert result.exit_code == 0, result.output
    ids = torch.tensor(sorted(_token(target, c) for c in "edc"))
    checkpoint = read_head_checkpoint(head)
    config = checkpoint.config
    assert config["draft_vocab_size"] == 3 and config["draft_vocab"]["training_split_tokens"] == 28
    assert config["draft_vocab"]["coverage"] == round((10 + 8 + 5) / 28, 4)
    assert config["draft_vocab"]["command"] == f"refengine draft-vocab --head {head} --target {TARGET} --size 3 --source {sharegpt}"
    assert torch.equal(checkpoint.tensors["d2t"] + torch.arange(3), ids)
    # The rows are the target's (tied: its embedding's), in the head's fp16.
    assert torch.equal(checkpoint.tensors["lm_head.weight"], target.model.embed_tokens.weight.detach()[ids].half())

    network = build_network(SpeculativeConfig("eagle3", 3), target, LAYOUT, checkpoint)
    drafted = network.greedy_tokens(torch.randn(64, target.config.hidden_size))
    assert set(drafted.tolist()) <= set(ids.tolist())
    assert len(set(drafted.tolist())) > 1  # the map is not stuck on one id


def test_held_out_conversations_contribute_nothing(target, head, sharegpt):
    # 'z' outnumbers every training token, but only in a held-out conversation.
    assert _run("--head", head, "--target", TARGET, "--size", 50, "--source", sharegpt).exit_code == 0
    d2t = read_head_checkpoint(head).tensors["d2t"]
    vocab = (d2t + torch.arange(len(d2t))).tolist()
    assert vocab == sorted(_token(target, c) for c in "abcde")


def test_a_second_run_replaces_the_vocabulary(target, head, sharegpt):
    assert _run("--head", head, "--target", TARGET, "--size", 4, "--source", sharegpt).exit_code == 0
    assert _run("--head", head, "--target", TARGET, "--size", 2, "--source", sharegpt).exit_code == 0
    checkpoint = read_head_checkpoint(head)
    assert checkpoint.tensors["lm_head.weight"].shape[0] == checkpoint.config["draft_vocab_size"] == 2


def test_the_head_without_its_vocabulary_is_the_trained_head_again(target, head, sharegpt, tmp_path):
    trained = read_head_checkpoint(head)
    assert _run("--head", head, "--target", TARGET, "--size", 3, "--source", sharegpt).exit_code == 0
    stripped = read_head_checkpoint(without_draft_vocab(head, tmp_path / "full"))
    assert stripped.config == trained.config
    assert stripped.tensors.keys() == trained.tensors.keys()
    assert all(torch.equal(t, trained.tensors[n]) for n, t in stripped.tensors.items())
    assert build_network(SpeculativeConfig("eagle3", 3), target, LAYOUT, stripped).lm_head is None


def test_engine_with_a_draft_vocabulary_head_is_lossless(target, head, sharegpt):
    assert _run("--head", head, "--target", TARGET, "--size", 5, "--source", sharegpt).exit_code == 0
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    baseline = [o.token_ids for o in LLM(target, max_num_seqs=2, num_blocks=32, block_size=4, max_model_len=64).generate(prompts, params)]
    spec = SpeculativeConfig("eagle3", 3, model=str(head))
    llm = LLM(target, max_num_seqs=2, num_blocks=32, block_size=4, max_model_len=64, speculative_config=spec)
    assert llm.engine.core.runner.drafter.network.lm_head.weight.shape[0] == 5
    assert [o.token_ids for o in llm.generate(prompts, params)] == baseline
    assert build_proposer(spec, target, LAYOUT).random_init is False


@pytest.mark.parametrize(
    ("edit", "args", "message"),
    [
        (lambda c: {**c, "model_type": "eagle"}, ("--size", 3), "model_type is 'eagle'"),
        (None, ("--size", 10_000), "exceeds the target's vocabulary of 320"),
        (None, ("--size", 0), "Invalid value for '--size'"),
    ],
)
def test_bad_input_is_a_one_line_error_and_the_head_is_unchanged(target, head, sharegpt, edit, args, message):
    if edit is not None:
        config = json.loads((head / "config.json").read_text())
        (head / "config.json").write_text(json.dumps(edit(config)))
    before = {f.name: f.read_bytes() for f in head.iterdir()}
    result = _run("--head", head, "--target", TARGET, "--source", sharegpt, *args)
    assert result.exit_code != 0 and message in result.output
    assert "Traceback" not in result.output
    assert {f.name: f.read_bytes() for f in head.iterdir()} == before


def test_a_source_without_training_text_is_refused(target, head, tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps([{"id": f"{_conversation(True)}_0", "conversations": [{"from": "human", "value": "zz"}]}]))
    result = _run("--head", head, "--target", TARGET, "--size", 3, "--source", empty)
    assert result.exit_code == 1 and "no training-split conversation with text" in result.output
