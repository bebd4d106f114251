"""Named random-weight shapes, the synthetic acceptance mode and device plumbing, on the CPU."""

import pytest
import torch

from refengine.engine.llm import LLM
from refengine.model import load_model
from refengine.model.config import Numerics
from refengine.model.device import move_to_device
from refengine.model.errors import ModelLoadError
from refengine.model.roofline import kv_bytes_per_token, weight_bytes_per_step
from refengine.model.shapes import SHAPES, build_random_model
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.worker.synthetic_acceptance import synthetic_num_accepted

SMALL = {"num_hidden_layers": 2, "vocab_size": 600, "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip


def test_qwen3_8b_reads_the_issue_figure_per_step():
    # 15.14 GB of bf16 weights per decode step (embedding excluded, untied lm_head included)
    assert weight_bytes_per_step(SHAPES["qwen3-8b"], torch.bfloat16) == pytest.approx(15.14e9, rel=2e-3)
    assert kv_bytes_per_token(SHAPES["qwen3-8b"], torch.bfloat16) == 36 * 8 * 128 * 2 * 2
    assert SHAPES["qwen3-0.6b"].tie_word_embeddings and not SHAPES["llama3-8b"].tie_word_embeddings


def test_random_model_is_seeded_and_loads_by_name(monkeypatch):
    a = build_random_model("qwen3-8b", seed=3, dtype=torch.float32, device="cpu", **SMALL)
    b = build_random_model("random:qwen3-8b", seed=3, dtype=torch.float32, device="cpu", **SMALL)
    c = build_random_model("qwen3-8b", seed=4, dtype=torch.float32, device="cpu", **SMALL)
    wa, wb, wc = (m.model.layers[1].mlp.down_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert a.source.format == "random" and a.source.path.startswith("random:qwen3-8b")
    std = float(wa.std())
    assert 0.8 < std * 128**0.5 < 1.2  # 1/sqrt(fan_in)
    with pytest.raises(ModelLoadError):
        load_model("random:qwen9-1t")
    # load_model resolves names to build_random_model
    seen = {}
    import refengine.model.shapes as shapes

    monkeypatch.setattr(shapes, "build_random_model", lambda name, **kw: seen.setdefault(name, kw))
    load_model("random:qwen3-0.6b", dtype=torch.bfloat16, numerics="fast")
    assert seen["qwen3-0.6b"]["dtype"] is torch.bfloat16 and seen["qwen3-0.6b"]["numerics"] is Numerics.FAST
    # A bare shape name that is no path is refused, naming the prefix that asks for random weights.
    with pytest.raises(ModelLoadError, match="use random:qwen3-0.6b"):
        load_model("qwen3-0.6b")


def test_synthetic_acceptance_draws():
    assert synthetic_num_accepted(1.0, 7, 10, (4, 5, 6)) == 3
    assert synthetic_num_accepted(0.0, 7, 10, (4, 5, 6)) == 0
    assert synthetic_num_accepted(1.0, 7, 10, (4, -1, 6)) == 1  # a placeholder always rejects
    counts = [synthetic_num_accepted(0.5, key, 0, (1,)) for key in range(2000)]
    assert 0.45 < sum(counts) / len(counts) < 0.55
    assert counts == [synthetic_num_accepted(0.5, key, 0, (1,)) for key in range(2000)]


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_engine_with_synthetic_acceptance(rate):
    loaded = build_random_model("qwen3-8b", seed=0, dtype=torch.float32, numerics="fast", device="cpu", **SMALL)
    llm = LLM(loaded, max_num_seqs=2, max_model_len=128, block_size=4, num_blocks=80,
              speculative_config=SpeculativeConfig("eagle", 3), synthetic_acceptance_rate=rate)
    outs = llm.generate([[1, 2, 3, 4], [9, 8, 7]], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    stats = llm.engine.core.scheduler.spec_decoding_stats
    llm.engine.core.shutdown()
    assert all(len(o.token_ids) == 12 for o in outs)
    assert stats.num_draft_tokens > 0
    assert stats.num_accepted_tokens == (stats.num_draft_tokens if rate == 1.0 else 0)


def test_move_to_device_replaces_kv_caches_on_the_way():
    from refengine.model.kv_cache import KVCache

    loaded = build_random_model("qwen3-8b", dtype=torch.float32, device="cpu", **SMALL)

    class Holder:
        pass

    holder = Holder()
    holder.__module__ = "refengine.test"
    holder.cache = KVCache.allocate(loaded.config, 2, 4, device="cpu")
    holder.model = loaded.model
    move_to_device(holder, "cpu")  # same device: a no-op that must not fail
    assert holder.cache.device.type == "cpu"
