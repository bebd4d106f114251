"""BlockTable: the KV block ids of every request the runner holds, one preallocated host row each.

A request's blocks only grow while the runner holds it (a preemption frees them all and the request
comes back as a new one), so a step writes only the blocks added since the last one. Unused entries
hold -1, the padding the attention ops expect.

Invariant numbers refer to docs/invariants.md.
"""

import numpy as np

from refengine.worker.errors import RunnerInvariantError


class BlockTable:
    def __init__(self, max_num_reqs: int, max_num_blocks_per_req: int, block_size: int) -> None:
        self.block_size = block_size
        self.table = np.full((max_num_reqs, max_num_blocks_per_req), -1, dtype=np.int64)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int64)
        # Entries written since start: a steady step writes only new blocks (tests/worker/test_input_batch.py).
        self.num_writes = 0

    def add_row(self, row: int, block_ids: tuple[int, ...]) -> None:
        self.table[row] = -1
        self.num_blocks[row] = 0
        self.extend(row, block_ids)

    def extend(self, row: int, block_ids: tuple[int, ...]) -> None:
        """`block_ids` is all of the request's blocks; only those past the row's count are written."""
        held = int(self.num_blocks[row])
        # Invariant 17: a held request's blocks only grow; fewer would mean another request's table.
        if len(block_ids) < held:
            raise RunnerInvariantError(f"row {row}: {len(block_ids)} blocks sent, the runner holds {held}")
        if len(block_ids) > self.table.shape[1]:
            raise RunnerInvariantError(f"row {row}: {len(block_ids)} blocks exceed the {self.table.shape[1]} per request")
        if len(block_ids) > held:
            self.table[row, held : len(block_ids)] = block_ids[held:]
            self.num_blocks[row] = len(block_ids)
            self.num_writes += len(block_ids) - held

    def move_row(self, src: int, dst: int) -> None:
        self.table[dst] = self.table[src]
        self.num_blocks[dst] = self.num_blocks[src]
