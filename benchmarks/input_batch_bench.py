"""Host cost of one decode step's inputs on the CPU: the persistent InputBatch (input ids, positions,
attention metadata and sampling metadata gathered from preallocated rows) next to building the same
tensors from per-request Python lists (build_attention_metadata and SamplingMetadata.build, the path
the drafters still take; the runner took it every step before the InputBatch, with slower list code).
No model runs: this is the host work in front of a launch. A micro-benchmark, not a test: it prints
numbers with their context.

    python benchmarks/input_batch_bench.py [--requests 8,32] [--context 128,1024] [--block-size 16]
"""

import argparse
import platform
import random
import subprocess
import timeit

import torch

from refengine.model.attention_metadata_builder import build_attention_metadata
from refengine.sample.metadata import RowParams, SamplingMetadata
from refengine.worker.input_batch import InputBatch
from refengine.worker.request_state import CachedRequestState

CPU = torch.device("cpu")


def _requests(num: int, context: int, block_size: int) -> list[tuple[CachedRequestState, list[int]]]:
    """Each request's state and its token list."""
    blocks_per_req = -(-(context + 1) // block_size)
    out = []
    for i in range(num):
        rng = random.Random(i)
        params = RowParams(0.0 if i % 2 else 0.8, 0, 1.0, 0, (), (), rng_key=rng.getrandbits(64))
        blocks = tuple(range(i * blocks_per_req, (i + 1) * blocks_per_req))
        tokens = [rng.randrange(3, 30000) for _ in range(context)]
        out.append((CachedRequestState(f"r{i}", context, 16, context - 1, blocks, params, None), tokens))
    return out


def _from_lists(requests: list[tuple[CachedRequestState, list[int]]], block_size: int) -> None:
    """One decode token per request, every tensor built from the requests' Python lists."""
    states = [s for s, _ in requests]
    ids = torch.tensor([tokens[s.num_computed_tokens] for s, tokens in requests], dtype=torch.long)
    positions = torch.tensor([s.num_computed_tokens for s in states], dtype=torch.long)
    build_attention_metadata(
        [s.num_computed_tokens for s in states], [1] * len(states), [s.block_ids for s in states], block_size
    )
    SamplingMetadata.build([s.params for s in states], [s.num_tokens for s in states], [[] for _ in states], CPU)
    del ids, positions


def _from_rows(batch: InputBatch, states: list[CachedRequestState]) -> None:
    rows = [batch.req_id_to_index[s.req_id] for s in states]
    starts = [s.num_computed_tokens for s in states]
    batch.prepare_inputs(rows, starts, [1] * len(states), starts)
    batch.sampling_metadata(rows, [s.num_tokens for s in states], [], CPU)


def _per_step(fn, *args, repeat: int) -> float:
    """Microseconds per call, the best of three runs of `repeat` calls."""
    return min(timeit.repeat(lambda: fn(*args), number=repeat, repeat=3)) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="8,32")
    parser.add_argument("--context", default="128,1024")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, commit {commit}, block_size {args.block_size}, one decode token each")
    print("| requests | context | from lists (us/step) | from rows (us/step) |")
    print("|---|---|---|---|")
    for num in (int(n) for n in args.requests.split(",")):
        for context in (int(c) for c in args.context.split(",")):
            requests = _requests(num, context, args.block_size)
            batch = InputBatch(num, context + 1, -(-(context + 1) // args.block_size), args.block_size)
            for state, tokens in requests:
                batch.add_request(state, tokens)
            lists = _per_step(_from_lists, requests, args.block_size, repeat=args.repeat)
            rows = _per_step(_from_rows, batch, [s for s, _ in requests], repeat=args.repeat)
            print(f"| {num} | {context} | {lists:.0f} | {rows:.0f} |")


if __name__ == "__main__":
    main()
