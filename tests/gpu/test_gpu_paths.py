"""The GPU paths on a CUDA device: the Triton kernels compiled (the interpreter cases plus real
shapes), CUDA-graph replay against eager steps, and drafters moved to the device.

Run on a GPU machine with `pytest -m gpu tests/gpu`; skipped elsewhere.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))

from device_cases import *  # noqa: E402,F403
from skinny_linear_cases import *  # noqa: E402,F403
from triton_attention_cases import *  # noqa: E402,F403  (the interpreter's cases, compiled here)
from triton_attention_cases import clone_cache, decode_rows_of, make_case, reference, rel_err  # noqa: E402

from refengine.engine.llm import LLM  # noqa: E402
from refengine.model import triton_attention as kernels  # noqa: E402
from refengine.model.config import Numerics  # noqa: E402
from refengine.model.ops import GPU_TILE_ROWS, linear  # noqa: E402
from refengine.model.shapes import build_random_model  # noqa: E402
from refengine.sampling_params import SamplingParams  # noqa: E402
from refengine.spec_decode.config import SpeculativeConfig  # noqa: E402
from refengine.spec_decode.head_checkpoint import read_head_checkpoint, save_head  # noqa: E402
from refengine.spec_decode.registry import KVLayout, build_network  # noqa: E402
from refengine.train.draft_vocab import add_draft_vocab, target_lm_head_rows  # noqa: E402

REAL = {"num_heads": 32, "num_kv_heads": 8, "head_dim": 128, "block_size": 16}


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("numerics", [Numerics.FAST, Numerics.BATCH_INVARIANT])
def test_real_shapes(dtype, tolerance, numerics):
    # decode rows at ~1k context, a verify block of 5, a 300-token prefill over a cached prefix
    q, k, v, cache, meta = make_case([1100, 1023, 900, 20], [1, 1, 5, 300], dtype=dtype, seed=3, **REAL)
    ours = clone_cache(cache)
    out = kernels.triton_paged_attention(q, k, v, ours, meta, 128**-0.5, numerics)
    torch.cuda.synchronize()
    ref, ref_cache = reference(q, k, v, cache, meta)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < tolerance
    assert torch.equal(ours.key.cpu(), ref_cache.key.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_rows_are_bitwise_the_decode_rows_at_real_shapes(dtype):
    """Invariant 52 (docs/invariants.md) compiled at qwen3-8b's attention shapes: verify blocks of 5 rows inside
    one window, across a window edge and across a key split, against the same rows decoded one by one."""
    q, k, v, cache, meta = make_case([1147, 1150, 254, 60], [5, 5, 5, 1], dtype=dtype, seed=5, **REAL)
    verified_cache = clone_cache(cache)
    verified = kernels.triton_paged_attention(q, k, v, verified_cache, meta, 128**-0.5, Numerics.BATCH_INVARIANT)
    decoded = kernels.triton_paged_attention(
        q, k, v, clone_cache(verified_cache), decode_rows_of(meta, REAL["block_size"]), 128**-0.5,
        Numerics.BATCH_INVARIANT,
    )  # fmt: skip
    torch.cuda.synchronize()
    assert torch.equal(verified, decoded), (verified != decoded).any(dim=-1).nonzero().flatten().tolist()


def tiny(numerics, dtype=torch.float32, layers=3):
    return build_random_model(
        "qwen3-0.6b", seed=1, dtype=dtype, numerics=numerics, device="cuda",
        num_hidden_layers=layers, vocab_size=1024, hidden_size=256, intermediate_size=512,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64,
    )  # fmt: skip


PROMPTS = [[5, 9, 13, 200, 7] * 3, [100, 3, 3, 4], list(range(20, 60))]


def generate(loaded, spec_step: bool = True, params=None, **kwargs):
    """Tokens of PROMPTS (3 requests: a graph of 4 pads them), greedy unless `params`; without `spec_step`
    a uniform verify step goes the general way (the sampler's and the drafter's own graphs)."""
    llm = LLM(loaded, dtype=str(loaded.model.embed_tokens.weight.dtype).removeprefix("torch."), max_num_seqs=4,
              max_model_len=256, block_size=16, num_blocks=64, **kwargs)
    if not spec_step:
        llm.engine.core.runner.dispatcher.uniform = None
    params = params or SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    runner = llm.engine.core.runner
    llm.engine.core.shutdown()
    return [o.token_ids for o in outs], runner


def test_tiled_linear_rows_on_the_gpu_ignore_batch_size_position_and_neighbours():
    """cuBLAS picks its kernel by shape too: a row's product is the same bits alone, in any batch size
    around the GPU tile, and at any position among other rows."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(1536, 1024, generator=gen, device="cuda") / 32
    x = torch.randn(2 * GPU_TILE_ROWS + 5, 1024, generator=gen, device="cuda")
    alone = torch.cat([linear(x[i : i + 1], weight, Numerics.BATCH_INVARIANT) for i in range(x.shape[0])])
    for num_rows in (2, GPU_TILE_ROWS - 1, GPU_TILE_ROWS + 1, x.shape[0]):
        assert torch.equal(linear(x[:num_rows], weight, Numerics.BATCH_INVARIANT), alone[:num_rows])
    shuffled = torch.randn_like(x)
    shuffled[70] = x[0]
    assert torch.equal(linear(shuffled, weight, Numerics.BATCH_INVARIANT)[70], alone[0])


def test_graphs_captured_at_the_asked_sizes_only_pad_smaller_batches():
    """cuda_graph_sizes (4,): every decode batch of 1..3 rows pads up to the one graph; tokens unchanged."""
    loaded = tiny(Numerics.BATCH_INVARIANT)
    eager, _ = generate(loaded, cuda_graphs=False)
    graphed, runner = generate(loaded, cuda_graph_sizes=(4,))
    assert runner.dispatcher.target.batch_sizes == [4]
    assert runner.num_graph_steps > 0 and runner.dispatcher.target.graphs.num_replays == runner.num_graph_steps
    assert graphed == eager


def test_cuda_graphs_replay_eager_tokens_bitwise():
    """Batch-invariant numerics: padded graph batches give the tokens of unpadded eager steps."""
    loaded = tiny(Numerics.BATCH_INVARIANT)
    eager, eager_runner = generate(loaded, cuda_graphs=False)
    graphed, runner = generate(loaded, cuda_graphs=True)
    assert eager_runner.num_graph_steps == 0
    assert runner.num_graph_steps > 0 and runner.dispatcher.target.graphs.num_replays == runner.num_graph_steps
    assert graphed == eager


@pytest.mark.parametrize("method", [None, "eagle3"])
def test_steps_that_mix_a_prefill_with_decodes_replay_graphs_with_eager_tokens(method):
    """Chunked prefill puts the long prompt's chunks beside the others' decode (or verify) rows: those
    steps replay the token-count graphs (worker/target_graphs.py), counted, with the eager steps' tokens."""
    loaded = tiny(Numerics.BATCH_INVARIANT, layers=4)
    spec = None if method is None else SpeculativeConfig(method, 3)
    eager, _ = generate(loaded, cuda_graphs=False, long_prefill_token_threshold=8, speculative_config=spec)
    graphed, runner = generate(loaded, long_prefill_token_threshold=8, speculative_config=spec)
    assert runner.dispatcher.target.num_mixed_replays > 0
    assert runner.num_eager_steps == 0 and runner.dispatcher.target.graphs.num_replays == runner.num_graph_steps
    assert graphed == eager


@pytest.mark.parametrize("method", ["eagle", "eagle3", "dflash"])
def test_fast_spec_steps_run_the_skinny_products_and_graphs_replay_eager_tokens(method, monkeypatch):
    """Fast numerics in float32: products of at most 8 rows (here the drafters' passes over 3 requests)
    run in the skinny kernels, the drafters rotate q/k in the fused kernel (both counted: capture and
    eager steps call them), and the graphs replay the eager steps' tokens (the same kernels at the same
    shapes)."""
    from refengine.model import skinny_linear
    from refengine.spec_decode import draft_layer

    calls, rotations = [], []
    original, original_rotation = skinny_linear.skinny_linear, draft_layer.fused_norm_rope

    def counted(x, weight):
        calls.append(x.shape[0])
        return original(x, weight)

    def counted_rotation(*args):
        rotations.append(args[0].shape[0])
        return original_rotation(*args)

    monkeypatch.setattr(skinny_linear, "skinny_linear", counted)
    monkeypatch.setattr(draft_layer, "fused_norm_rope", counted_rotation)
    loaded = tiny(Numerics.FAST, layers=4)
    spec = SpeculativeConfig(method, 3)
    eager, eager_runner = generate(loaded, speculative_config=spec, cuda_graphs=False)
    assert any(2 <= rows <= skinny_linear.MAX_ROWS for rows in calls)  # the drafters' passes at least
    assert rotations  # the drafter's attention took the fused rotary
    graphed, runner = generate(loaded, speculative_config=spec, cuda_graphs=True)
    assert eager_runner.num_graph_steps == 0 and runner.num_graph_steps > 0
    assert runner.dispatcher.uniform.graphs.num_replays > 0
    assert graphed == eager


def test_eagle_on_the_gpu_is_lossless_and_graphs_verify():
    loaded = tiny(Numerics.BATCH_INVARIANT)
    base, _ = generate(loaded, cuda_graphs=False)
    spec, runner = generate(loaded, speculative_config=SpeculativeConfig("eagle", 3), cuda_graphs=True)
    assert spec == base
    assert runner.num_graph_steps > 0


def test_synthetic_acceptance_runs_at_its_rate():
    loaded = tiny(Numerics.FAST, torch.bfloat16)
    llm = LLM(loaded, dtype="bfloat16", max_num_seqs=4, max_model_len=512, block_size=16, num_blocks=128,
              speculative_config=SpeculativeConfig("eagle", 4), synthetic_acceptance_rate=0.5)
    llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True))
    stats = llm.engine.core.scheduler.spec_decoding_stats
    llm.engine.core.shutdown()
    # P(accept draft j) = 0.5 ** j; mean accepted per step of k=4: 0.5 + 0.25 + 0.125 + 0.0625
    assert 0.2 < stats.num_accepted_tokens / stats.num_draft_tokens < 0.3


def test_reference_backend_on_the_gpu_matches_triton_tokens_in_float32():
    loaded = tiny(Numerics.BATCH_INVARIANT)
    triton_tokens, _ = generate(loaded, cuda_graphs=False)
    reference_tokens, runner = generate(loaded, cuda_graphs=False, attention_backend="reference")
    assert reference_tokens == triton_tokens


def test_oracle_matrix_on_the_gpu_is_identical():
    """Every front x chunking x preemption x bad_words arm of no-spec, eagle and the teacher on a tiny model, on
    the GPU, with the absolute checks (stops, bad_words, greedy argmax of a fresh forward)."""
    proc = subprocess.run(
        [sys.executable, "-m", "refengine.cli", "oracle", "--model", "tiny-llama", "--methods", "none,eagle,teacher",
         "--c", "2", "--prompts", "2", "--max-tokens", "16", "--device", "cuda"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 failed arm(s)" in proc.stdout


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "graphs"])
def test_zero_bubble_eagle_waits_for_no_spec_step_and_keeps_the_tokens(cuda_graphs):
    """Invariant 48 (docs/invariants.md) on a GPU: async EAGLE equals sync EAGLE and spec off token for
    token (batch-invariant numerics), eager and replayed, and no spec step waits for its results (the
    overlap itself needs real shapes: test_device_pipeline.py)."""
    loaded = tiny(Numerics.BATCH_INVARIANT)
    base, _ = generate(loaded, cuda_graphs=False)
    spec = SpeculativeConfig("eagle", 3)
    sync, _ = generate(loaded, speculative_config=spec, async_scheduling=False, cuda_graphs=cuda_graphs)
    zero_bubble, runner = generate(loaded, speculative_config=spec, async_scheduling=True, cuda_graphs=cuda_graphs)
    assert zero_bubble == sync == base
    assert runner.num_readback_steps == 0 and runner.num_corrected_launches > 10
    assert (runner.num_graph_steps > 0) == cuda_graphs


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp", "dflash"])
def test_drafter_step_graphs_replay_the_eager_drafters_tokens(method):
    """Pass 1 and the proposal replayed from one graph per padded batch size after each uniform verify
    step, the sampler's own graph before it (the general way, without the one-graph step): the tokens
    of eager drafting, spec off's, and steps that replayed."""
    loaded = tiny(Numerics.BATCH_INVARIANT, layers=4)
    base, _ = generate(loaded, cuda_graphs=False)
    spec = SpeculativeConfig(method, 3)
    eager, _ = generate(loaded, speculative_config=spec, cuda_graphs=False)
    graphed, runner = generate(loaded, spec_step=False, speculative_config=spec, cuda_graphs=True)
    assert graphed == eager == base
    assert runner.drafter.graphs.steps.num_replays > 0
    assert runner.dispatcher.sampler.graphs.num_replays > 0


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp", "dflash"])
@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "seeded"])
def test_uniform_steps_replay_as_one_graph_with_the_eager_tokens(method, temperature):
    """worker/spec_step_graphs.py on a GPU: verification, the drafter's step and the frame of each uniform
    verify step replayed as one graph on the outputs of the target's (3 requests padded to 4): the tokens
    of the eager engine, greedy and seeded, and every replay moved back by its predecessor's rejections."""
    loaded = tiny(Numerics.BATCH_INVARIANT, layers=4)
    spec = SpeculativeConfig(method, 3)
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=24, ignore_eos=True) for i in range(len(PROMPTS))]
    eager, _ = generate(loaded, params=params, speculative_config=spec, cuda_graphs=False)
    graphed, runner = generate(loaded, params=params, speculative_config=spec, cuda_graphs=True)
    assert graphed == eager
    uniform = runner.dispatcher.uniform.graphs.stats
    assert uniform.num_replays > 10 and uniform.num_eager_steps == 0
    assert runner.num_readback_steps == 0 and runner.num_corrected_launches > 10


def test_eagle3_with_a_draft_vocabulary_replays_its_own_lm_head(tmp_path):
    """An eagle3 head with its own lm_head over a draft vocabulary (draft_vocab.py, as the shipped
    SmolLM2 head has one) drafts from its graphs on the GPU: the tokens of eager drafting and spec off's."""
    loaded = tiny(Numerics.BATCH_INVARIANT, layers=4)
    network = build_network(SpeculativeConfig("eagle3", 3), loaded, KVLayout(64, 16))
    folder = save_head(network.cpu(), {"model_type": "eagle3"}, tmp_path / "head")
    ids = torch.arange(0, loaded.config.vocab_size, 4)
    add_draft_vocab(read_head_checkpoint(folder), ids, target_lm_head_rows(loaded, ids), {})
    spec = SpeculativeConfig("eagle3", 3, model=str(folder))
    base, _ = generate(loaded, cuda_graphs=False)
    eager, _ = generate(loaded, speculative_config=spec, cuda_graphs=False)
    graphed, runner = generate(loaded, speculative_config=spec, cuda_graphs=True)
    assert graphed == eager == base
    assert runner.drafter.network.lm_head.weight.shape[0] == len(ids)
    assert runner.dispatcher.uniform.graphs.num_replays > 0


# Steps of every sampler graph variant: seeded rows, top-k and top-p, (row, token) masks (stop tokens
# below min_tokens), and greedy rows under the same masks.
SAMPLER_STEPS = {
    "seeded": dict(temperature=0.9),
    "top-k and top-p": dict(temperature=1.0, top_k=5, top_p=0.8),
    "masked": dict(temperature=0.9, min_tokens=20, stop_token_ids=[3, 5, 7, 11, 13]),
    "greedy masked": dict(temperature=0.0, min_tokens=20, stop_token_ids=[3, 5, 7, 11, 13]),
}


@pytest.mark.parametrize("step", SAMPLER_STEPS, ids=list(SAMPLER_STEPS))
def test_sampler_graphs_replay_verification_as_eager(step):
    """Rows of each variant with k = 3 drafts: the replayed rejection sampler emits the eager one's tokens
    (counter-based draws keyed by request and position, the same on either path)."""
    loaded = tiny(Numerics.BATCH_INVARIANT)
    params = [SamplingParams(seed=i, max_tokens=24, ignore_eos=True, **SAMPLER_STEPS[step]) for i in range(len(PROMPTS))]
    outs = {}
    for graphs in (False, True):
        llm = LLM(loaded, dtype="float32", max_num_seqs=4, max_model_len=256, block_size=16, num_blocks=64,
                  speculative_config=SpeculativeConfig("eagle", 3), cuda_graphs=graphs)
        runner = llm.engine.core.runner
        runner.dispatcher.uniform = None  # the sampler's own graphs, for every variant
        outs[graphs] = [o.token_ids for o in llm.generate(PROMPTS, params)]
        llm.engine.core.shutdown()
    assert outs[True] == outs[False]
    assert runner.dispatcher.sampler.graphs.num_replays > 0


def test_zero_bubble_synthetic_acceptance_draws_on_the_device_as_on_the_host():
    """The synthetic rule reads its keys and exact positions on the device: the async run, whose host
    counts are optimistic when it draws, accepts what the sync run accepts, so emits the same tokens."""
    loaded = tiny(Numerics.BATCH_INVARIANT)
    spec = SpeculativeConfig("eagle", 4)
    runs = [
        generate(loaded, speculative_config=spec, async_scheduling=on, synthetic_acceptance_rate=0.7)
        for on in (False, True)
    ]
    assert runs[0][0] == runs[1][0]
    assert runs[1][1].num_readback_steps == 0
