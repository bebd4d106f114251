"""Parity with transformers' own modeling code on the same weights (fp32).

Bounds: ||ours - ref||_2 / ||ref||_2 <= 1e-4 over all positions' logits, and max |ours - ref| <= 1e-3
(SmolLM2's logits reach ~40 in magnitude; measured max |delta| is ~1e-4 there, ~1e-5 on tiny models).
"""

import json
from pathlib import Path

import pytest
import torch
from model_drive import greedy, prefill_logits
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from refengine.model import LoadedModel, build_tiny_model, embedded_smollm2_path, load_model, save_hf_folder
from refengine.tokenizer import ChatMessage

MAX_RELATIVE_L2 = 1e-4
MAX_ABS = 1e-3

PLAIN_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "1, 1, 2, 3, 5, 8,",
    "Water boils at",
]
CHAT_PROMPTS = [
    "What is the tallest mountain in the world?",
    "Write a haiku about the sea.",
]


def _assert_close_logits(ours: torch.Tensor, ref: torch.Tensor) -> None:
    relative = float((ours - ref).norm() / ref.norm())
    max_abs = float((ours - ref).abs().max())
    assert relative <= MAX_RELATIVE_L2, f"relative L2 {relative:.2e}"
    assert max_abs <= MAX_ABS, f"max |delta| {max_abs:.2e}"


def _ref_logits(ref: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return ref(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("variant", ["llama", "qwen3", "llama3-rope-scaling"])
@pytest.mark.parametrize("numerics", ["batch_invariant", "fast"])
def test_tiny_models_match_transformers(tmp_path: Path, variant: str, numerics: str) -> None:
    folder = save_hf_folder(
        build_tiny_model(variant.split("3-")[0].removesuffix("-rope-scaling"), seed=9), tmp_path
    )
    if variant == "llama3-rope-scaling":
        config = json.loads((folder / "config.json").read_text())
        config["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        (folder / "config.json").write_text(json.dumps(config))
    ours = load_model(folder, numerics=numerics)
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = [(7 * i + 3) % ours.config.vocab_size for i in range(150)]
    _assert_close_logits(prefill_logits(ours.model, ids), _ref_logits(ref, ids))


@pytest.fixture(scope="module")
def smollm2_reference() -> torch.nn.Module:
    """transformers' Llama on weights that transformers itself dequantizes from the GGUF."""
    path = str(embedded_smollm2_path())
    config = LlamaConfig(**load_gguf_checkpoint(path)["config"])
    ref = LlamaForCausalLM(config)
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=ref)["tensors"]
    ref.load_state_dict(tensors, strict=False)
    ref.tie_weights()
    return ref.eval()


def _prompt_ids(loaded: LoadedModel, prompt: str, chat: bool) -> list[int]:
    tokenizer = loaded.tokenizer
    if chat:
        return tokenizer.encode(tokenizer.apply_chat_template([ChatMessage("user", prompt)]))
    return tokenizer.encode(prompt)


@pytest.mark.model
def test_smollm2_logits_match_transformers_at_every_position(
    smollm2: LoadedModel, smollm2_reference: torch.nn.Module
) -> None:
    for prompt, chat in [(PLAIN_PROMPTS[1], False), (CHAT_PROMPTS[0], True)]:
        ids = _prompt_ids(smollm2, prompt, chat)
        _assert_close_logits(prefill_logits(smollm2.model, ids), _ref_logits(smollm2_reference, ids))


def _reference_greedy(
    ref: torch.nn.Module, ids: list[int], max_new_tokens: int, stop_ids: tuple[int, ...]
) -> list[int]:
    with torch.inference_mode():
        out = ref.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=list(stop_ids),
            pad_token_id=stop_ids[0],
        )
    return out[0, len(ids) :].tolist()


def _check_greedy(
    smollm2: LoadedModel, ref: torch.nn.Module, prompts: list[tuple[str, bool]], max_new: int
) -> None:
    stop_ids = smollm2.tokenizer.eos_token_ids
    for prompt, chat in prompts:
        ids = _prompt_ids(smollm2, prompt, chat)
        ours = greedy(smollm2.model, ids, max_new, stop_ids)
        assert ours == _reference_greedy(ref, ids, max_new, stop_ids), prompt


@pytest.mark.model
def test_smollm2_short_greedy_matches_transformers(
    smollm2: LoadedModel, smollm2_reference: torch.nn.Module
) -> None:
    _check_greedy(smollm2, smollm2_reference, [(PLAIN_PROMPTS[0], False), (CHAT_PROMPTS[1], True)], 16)


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_greedy_64_tokens_matches_transformers(
    smollm2: LoadedModel, smollm2_reference: torch.nn.Module
) -> None:
    prompts = [(p, False) for p in PLAIN_PROMPTS] + [(p, True) for p in CHAT_PROMPTS]
    _check_greedy(smollm2, smollm2_reference, prompts, 64)
