"""The fixed-shape drafter proposals under the Triton attention kernels, run by
tests/model/test_triton_attention.py in a fresh process under Triton's interpreter (TRITON_INTERPRET=1 must be
set before triton is imported): with the CUDA graphs' padding, rows that sit out, and DFlash's block
rows past a request's last real one, the kernels give the reference's drafts and write no KV for them."""

import pytest
import torch

from refengine.model import attention, build_tiny_model
from refengine.model.config import Kernels
from refengine.model.layers import set_kernels
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.draft_graphs import DraftGraphs
from refengine.spec_decode.proposer import ProposalInputs
from refengine.spec_decode.registry import KVLayout, build_proposer


def _draft(target, method: str, attention: str):
    drafter = build_proposer(SpeculativeConfig(method, 3), target, KVLayout(16, 4))
    set_kernels(drafter.network, Kernels(attention, False))
    generator = torch.Generator().manual_seed(1)
    for layer in drafter.network.kv_cache.layers:  # a committed context in blocks 1..3 to attend over
        layer.key[1:4].copy_(torch.randn(layer.key[1:4].shape, generator=generator))
        layer.value[1:4].copy_(torch.randn(layer.value[1:4].shape, generator=generator))
    hidden = None
    if drafter.reads_hidden:
        hidden = torch.randn(2, target.config.hidden_size, generator=torch.Generator().manual_seed(0))
    # Request 0 wants all 3 drafts; request 1 one (it sits out the rest); two padded rows (block 0).
    inputs = ProposalInputs(
        torch.tensor([42, 7]), torch.tensor([6, 5]), torch.tensor([3, 1]), torch.tensor([[1, 2, 3], [3, 1, -1]]), hidden
    )
    graphs = DraftGraphs(drafter, (target.config.hidden_size, torch.float32), 5, [4], torch.device("cpu"))
    with torch.inference_mode():
        drafts = graphs.run_proposal(inputs, 4)  # padded to 4 rows, 5 block columns, as a replay is
    return drafts, drafter.network.kv_cache


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp", "dflash"])
def test_triton_kernels_draft_what_the_reference_drafts(method):
    target = build_tiny_model("qwen3", seed=3, num_hidden_layers=4)
    reference, _ = _draft(target, method, "reference")
    before = attention.ATTENTION_CALLS["triton"]
    triton, cache = _draft(target, method, "triton")
    assert attention.ATTENTION_CALLS["triton"] > before  # the kernels ran
    assert torch.equal(triton[:, :1], reference[:, :1])
    assert torch.equal(triton[0], reference[0])
    assert not any(layer.key[0].any() or layer.value[0].any() for layer in cache.layers)
