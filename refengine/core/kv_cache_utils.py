"""Block hashes for automatic prefix caching, as vLLM v1 keys its cache: block i's hash is a hash of
(block i-1's hash, block i's token ids, extra keys), so a hash names the whole prefix up to the end of
its block, never just the block's own tokens.

The hash is sha256 over a fixed byte encoding, never Python's hash(), so it is the same in every
process and run (vLLM hashes with sha256 over cbor for the same reason).
"""

import hashlib
import json
import sys
from array import array
from collections.abc import Sequence

BlockHash = bytes

# The parent of a request's first block.
NONE_HASH: BlockHash = bytes(32)


def hash_block_tokens(
    parent_block_hash: BlockHash, block_token_ids: Sequence[int], extra_keys: tuple = ()
) -> BlockHash:
    """sha256 of the parent hash, the block's token count and ids (little-endian int64) and the extra
    keys (anything else the block's KV depends on) as canonical JSON."""
    tokens = array("q", block_token_ids)
    if sys.byteorder == "big":
        tokens.byteswap()
    digest = hashlib.sha256(parent_block_hash)
    digest.update(len(tokens).to_bytes(8, "little"))
    digest.update(tokens.tobytes())
    digest.update(json.dumps(list(extra_keys), separators=(",", ":")).encode())
    return digest.digest()


def extend_block_hashes(
    block_hashes: list[BlockHash], token_ids: Sequence[int], block_size: int, extra_keys: tuple = ()
) -> list[BlockHash]:
    """Append the hashes of the full blocks of token_ids not hashed yet; returns block_hashes."""
    for i in range(len(block_hashes), len(token_ids) // block_size):
        parent = block_hashes[-1] if block_hashes else NONE_HASH
        block_hashes.append(hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size], extra_keys))
    return block_hashes
