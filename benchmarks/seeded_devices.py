"""How many seeded tokens agree between the CPU and the GPU for the tiny models in float32
batch-invariant mode. A figure, not a test: the counter-based RNG's uniforms are bitwise equal on both
devices (tests/gpu), but the two devices' kernels round the logits differently, and one flipped token
changes the rest of its sequence.

    PYTHONPATH=. python3 benchmarks/seeded_devices.py
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refengine.engine.llm import LLM  # noqa: E402
from refengine.sampling_params import SamplingParams  # noqa: E402

PROMPTS = [[3 + (7 * i + j) % 250 for j in range(6 + 3 * i)] for i in range(8)]


def tokens(model: str, device: str) -> list[list[int]]:
    llm = LLM(model, device=device, dtype="float32", numerics="batch_invariant", max_num_seqs=8,
              max_model_len=256, kv_cache_memory_gib=0.25, cuda_graphs=False)
    params = [SamplingParams(temperature=0.8, seed=100 + i, max_tokens=32, ignore_eos=True) for i in range(8)]
    out = [o.token_ids for o in llm.generate(PROMPTS, params)]
    llm.engine.core.shutdown()
    return out


def main() -> None:
    result = {}
    for model in ("tiny-qwen3", "tiny-llama"):
        cpu, gpu = tokens(model, "cpu"), tokens(model, "cuda")
        same = sum(a == b for x, y in zip(cpu, gpu, strict=True) for a, b in zip(x, y, strict=True))
        prefix = sum(next((j for j, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), len(x))
                     for x, y in zip(cpu, gpu, strict=True))
        total = sum(len(x) for x in cpu)
        result[model] = {"tokens": total, "same_position_agree": same, "common_prefix_tokens": prefix,
                         "identical_sequences": sum(x == y for x, y in zip(cpu, gpu, strict=True)), "sequences": len(cpu)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
