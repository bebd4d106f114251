"""train-drafter end to end on a tiny target: data, training, a checkpoint the spec loader reads, the
same head again from the same seed, and lossless greedy decoding with the trained heads."""

import json

import pytest
import torch
from click.testing import CliRunner

from refengine.engine.llm import LLM
from refengine.model import build_tiny_model, save_hf_folder
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.head_checkpoint import read_head_checkpoint
from refengine.train.command import run_training, train_drafter_command
from refengine.train.trainer import METHODS, TrainConfig

DATA = dict(num_tokens=400, max_new_tokens=12, eval_tokens=0, data_batch=6, command="test")
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
ENGINE = dict(num_blocks=128, block_size=4, max_model_len=160)


@pytest.fixture(scope="module")
def target():
    return build_tiny_model("llama", seed=5, num_hidden_layers=4)


@pytest.fixture(scope="module")
def trained(target, tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    for method in METHODS:
        run_training(
            target,
            TrainConfig(method, steps=3, batch_tokens=256),
            root / method,
            cache_root=root / "cache",
            log=lambda _: None,
            **DATA,
        )
    return root


@pytest.mark.parametrize("method", METHODS)
def test_checkpoint_is_fp16_with_its_command(trained, method):
    checkpoint = read_head_checkpoint(trained / method)
    assert all(t.dtype == torch.float16 for t in checkpoint.tensors.values() if t.is_floating_point())
    assert checkpoint.config["training"]["command"] == "test"
    assert (trained / method / "COMMAND").read_text().strip() == "test"


def test_same_seed_same_head(target, trained, tmp_path):
    run_training(
        target,
        TrainConfig("eagle", steps=3, batch_tokens=256),
        tmp_path / "again",
        cache_root=trained / "cache",
        log=lambda _: None,
        **DATA,
    )
    first = read_head_checkpoint(trained / "eagle").tensors
    again = read_head_checkpoint(tmp_path / "again").tensors
    assert first.keys() == again.keys()
    assert all(torch.equal(first[n], again[n]) for n in first)


@pytest.mark.parametrize("max_num_seqs", [1, 4])
@pytest.mark.parametrize("method", METHODS)
def test_trained_heads_are_lossless(target, trained, method, max_num_seqs):
    prompts = [[5 + i, 40 + 3 * i, 7, 90 + i, 11] for i in range(4)]
    baseline = [o.token_ids for o in LLM(target, **ENGINE).generate(prompts, GREEDY)]
    spec = SpeculativeConfig(method, 3, model=str(trained / method))
    llm = LLM(target, **ENGINE, max_num_seqs=max_num_seqs, speculative_config=spec)
    assert not llm.engine.core.runner.drafter.random_init
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == baseline


def test_command_line_trains_and_records_itself(tmp_path):
    folder = save_hf_folder(build_tiny_model("llama", seed=5, num_hidden_layers=4), tmp_path / "target")
    out = tmp_path / "head"
    args = [
        "--target",
        str(folder),
        "--method",
        "mtp",
        "--out",
        str(out),
        "--tokens",
        "100",
        "--steps",
        "2",
        "--max-new-tokens",
        "8",
        "--eval-tokens",
        "40",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--threads",
        "1",
    ]
    result = CliRunner().invoke(train_drafter_command, args)
    assert result.exit_code == 0, result.output
    training = json.loads((out / "config.json").read_text())["training"]
    command = training["command"]
    assert command.startswith("refengine train-drafter --target ") and "--method mtp" in command
    # The held-out check walks the engine's loop once per k (the steps differ with k).
    offline = training["held_out_offline"]
    assert set(offline["steps"]) == set(offline["mean_accepted_length"]) == {"2", "4", "8"}
    assert offline["steps"]["2"] > 0 and len(offline["per_position"]) == 8
    assert "step 2/2" in result.output
