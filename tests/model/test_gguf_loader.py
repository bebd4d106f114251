"""GGUF loading: every supported tensor type, llama.cpp's names and q/k row order, clear errors."""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf_writing import write_gguf, write_single_tensor
from model_drive import prefill_logits

from refengine.model import LoadedModel, ModelLoadError, build_tiny_model, load_model
from refengine.model.gguf_file import GgufFile

Q = gguf.GGMLQuantizationType


def _read(path: Path, name: str = "w.weight") -> torch.Tensor:
    return GgufFile(path).tensor(name)


@pytest.mark.parametrize(
    ("qtype", "tolerance"),
    [(Q.F32, 0.0), (Q.F16, 1e-3), (Q.BF16, 1e-2), (Q.Q8_0, 0.02), (Q.Q4_1, 0.25), (Q.Q4_0, 0.35)],
)
def test_quantized_types_round_trip_within_their_precision(
    tmp_path: Path, qtype: Q, tolerance: float
) -> None:
    values = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    data = values if qtype == Q.F32 else gguf.quants.quantize(values, qtype)
    got = _read(write_single_tensor(tmp_path / "t.gguf", "w.weight", data, qtype))
    assert got.dtype == torch.float32 and tuple(got.shape) == (3, 64)
    assert float((got - torch.from_numpy(values)).abs().max()) <= tolerance


def _f16_bytes(value: float) -> bytes:
    return np.float16(value).tobytes()


def test_q4_k_blocks_decode_to_scale_times_quant_minus_min(tmp_path: Path) -> None:
    """A hand-made Q4_K block: 8 sub-blocks of 32 with 6-bit scales and mins, packed per the spec."""
    rng = np.random.default_rng(1)
    d, dmin = 0.5, 0.25
    scales, mins = rng.integers(0, 64, 8), rng.integers(0, 64, 8)
    quants = rng.integers(0, 16, 256)
    packed = np.zeros(12, dtype=np.uint8)
    for j in range(4):
        packed[j] = scales[j] | ((scales[j + 4] >> 4) << 6)
        packed[j + 4] = mins[j] | ((mins[j + 4] >> 4) << 6)
        packed[j + 8] = (scales[j + 4] & 0xF) | ((mins[j + 4] & 0xF) << 4)
    qs = np.zeros(128, dtype=np.uint8)
    for pair in range(4):  # sub-blocks 2*pair (low nibbles) and 2*pair+1 (high nibbles) share 32 bytes
        low, high = quants[64 * pair : 64 * pair + 32], quants[64 * pair + 32 : 64 * pair + 64]
        qs[32 * pair : 32 * pair + 32] = low | (high << 4)
    block = _f16_bytes(d) + _f16_bytes(dmin) + packed.tobytes() + qs.tobytes()
    data = np.frombuffer(block * 2, dtype=np.uint8).reshape(2, 144)
    expected = np.array([d * scales[i // 32] * quants[i] - dmin * mins[i // 32] for i in range(256)])
    got = _read(write_single_tensor(tmp_path / "k4.gguf", "w.weight", data, Q.Q4_K))
    assert tuple(got.shape) == (2, 256)
    np.testing.assert_allclose(got.numpy(), np.stack([expected, expected]), rtol=0, atol=1e-6)


def test_q6_k_blocks_decode_to_scale_times_centred_quant(tmp_path: Path) -> None:
    """A hand-made Q6_K block: 16 int8 scales of 16 values, 6-bit quants split into 4 low + 2 high bits."""
    rng = np.random.default_rng(2)
    d = 0.125
    scales = rng.integers(-128, 128, 16).astype(np.int8)
    quants = rng.integers(0, 64, 256)
    ql, qh = np.zeros(128, dtype=np.uint8), np.zeros(64, dtype=np.uint8)
    for half in range(2):  # each 128-value half: 64 ql bytes, 32 qh bytes
        q = quants[128 * half : 128 * half + 128]
        for lane in range(32):
            a, b, c, e = q[lane], q[lane + 32], q[lane + 64], q[lane + 96]
            ql[64 * half + lane] = (a & 0xF) | ((c & 0xF) << 4)
            ql[64 * half + lane + 32] = (b & 0xF) | ((e & 0xF) << 4)
            qh[32 * half + lane] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6)
    block = ql.tobytes() + qh.tobytes() + scales.tobytes() + _f16_bytes(d)
    data = np.frombuffer(block, dtype=np.uint8).reshape(1, 210)
    expected = np.array([d * scales[i // 16] * (quants[i] - 32) for i in range(256)])
    got = _read(write_single_tensor(tmp_path / "k6.gguf", "w.weight", data, Q.Q6_K))
    np.testing.assert_allclose(got.numpy()[0], expected, rtol=0, atol=1e-6)


def test_unsupported_tensor_type_is_named(tmp_path: Path) -> None:
    values = np.zeros((1, 32), dtype=np.float32)
    path = write_single_tensor(tmp_path / "q5.gguf", "w.weight", gguf.quants.quantize(values, Q.Q5_0), Q.Q5_0)
    with pytest.raises(ModelLoadError, match=r"'w\.weight' has unsupported type Q5_0"):
        _read(path)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tiny_gguf_loads_bit_for_bit(tmp_path: Path, arch: str) -> None:
    """llama.cpp names and (for llama) its q/k row permutation are undone exactly."""
    original = build_tiny_model(arch, seed=5)
    loaded = load_model(write_gguf(original, tmp_path / "tiny.gguf"))
    assert loaded.config == original.config
    assert (loaded.source.format, loaded.source.weight_type, loaded.source.arch) == ("gguf", "F32", arch)
    ids = list(range(3, 40))
    assert torch.equal(prefill_logits(original.model, ids), prefill_logits(loaded.model, ids))
    assert loaded.tokenizer.encode("héllo <|im_end|>") == original.tokenizer.encode("héllo <|im_end|>")


def test_q8_0_gguf_weights_are_the_dequantized_file(tmp_path: Path) -> None:
    original = build_tiny_model("qwen3", seed=6)
    loaded = load_model(write_gguf(original, tmp_path / "q8.gguf", qtype=Q.Q8_0))
    assert loaded.source.weight_type == "Q8_0"
    weight = original.model.layers[1].mlp.down_proj.weight.numpy()
    expected = gguf.quants.dequantize(gguf.quants.quantize(weight, Q.Q8_0), Q.Q8_0)
    assert torch.equal(loaded.model.layers[1].mlp.down_proj.weight, torch.from_numpy(expected))


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> tuple[LoadedModel, Path]:
    model = build_tiny_model("llama", seed=7)
    return model, write_gguf(model, tmp_path / "tiny.gguf")


def test_corrupt_gguf_names_the_file(tmp_path: Path, tiny_gguf: tuple[LoadedModel, Path]) -> None:
    _, good = tiny_gguf
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file at all" * 10)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[:5000])
    for path in (garbage, truncated):
        with pytest.raises(ModelLoadError, match=f"{path}: not a readable GGUF file"):
            load_model(path)


def test_unknown_architecture_is_named(tmp_path: Path) -> None:
    path = write_gguf(build_tiny_model("llama"), tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(ModelLoadError, match="unsupported architecture 'gpt2'"):
        load_model(path)


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    path = write_gguf(build_tiny_model("llama"), tmp_path / "short.gguf", drop="blk.1.ffn_up.weight")
    with pytest.raises(ModelLoadError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_model(path)


def test_missing_file_and_bad_numerics_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no such file"):
        load_model(tmp_path / "absent.gguf")
    with pytest.raises(ValueError, match="numerics"):
        load_model(tmp_path, numerics="approximate")


@pytest.mark.model
def test_smollm2_source_records_what_was_loaded(smollm2: LoadedModel) -> None:
    assert (smollm2.source.format, smollm2.source.weight_type, smollm2.source.arch) == (
        "gguf",
        "Q4_1",
        "llama",
    )
    assert smollm2.source.path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert smollm2.config.num_hidden_layers == 30 and smollm2.config.tie_word_embeddings
