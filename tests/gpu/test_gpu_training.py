"""Training on a CUDA device reaches every parameter of a head. The fused Triton ops have no backward: a
head trained through them gets no gradient through its norms (the eagle head shipped in 08e52be still
has norm weights of exactly 1.0, their initial value), so the trainer switches the head to the reference
ops. Without that switch the step's loss has no grad_fn on an H200 (torch 2.11, triton 3.6).

Run on a GPU machine with `pytest -m gpu tests/gpu`; skipped elsewhere.
"""

import pytest
import torch

from refengine.model import build_tiny_model
from refengine.spec_decode.head_checkpoint import read_head_checkpoint
from refengine.train.command import run_training
from refengine.train.sharegpt import ChatPrompt, export_prompts
from refengine.train.trainer import METHODS, TrainConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def target():
    loaded = build_tiny_model("llama", seed=5, num_hidden_layers=4)
    loaded.model.to("cuda")
    return loaded


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl.gz"
    export_prompts([ChatPrompt(f"conv{i}", 0, f"question {i}: tell me about it") for i in range(24)], path)
    return path


@pytest.mark.parametrize("method", METHODS)
def test_training_on_the_gpu_moves_every_norm(target, prompts_file, method, tmp_path):
    out = tmp_path / method
    run_training(
        target,
        TrainConfig(method, steps=4, batch_tokens=256, lr=1e-2),
        out,
        num_tokens=400,
        max_new_tokens=12,
        eval_tokens=0,
        cache_root=tmp_path / "cache",
        command="test",
        prompts=prompts_file,
        generate_seqs=8,
        log=lambda _: None,
    )
    norms = {n: t for n, t in read_head_checkpoint(out).tensors.items() if n.endswith("norm.weight")}
    assert norms
    assert not [n for n, t in norms.items() if bool((t == 1).all())]
