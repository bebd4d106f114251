"""SamplingMetadata.build and SpecDecodeMetadata.build, field by field: values from each row's params,
the documented dtypes at every batch size (the empty batch included), and the logits rows of each
request's slots. Device placement is in tests/sample/test_device_placement.py."""

import numpy as np
import torch

from refengine.sample import rng
from refengine.sample.metadata import RowParams, SamplingMetadata
from refengine.sample.rejection_sampler import SpecDecodeMetadata

CPU = torch.device("cpu")
INTS = ("top_k", "seeds", "key_words", "positions", "masked_rows", "masked_token_ids", "bitmask_rows")


def test_sampling_metadata_fields():
    params = [
        RowParams(0.0, 5, 1.0, 0, (), (), rng_key=2**64 - 1),
        RowParams(0.7, -3, 0.9, 0, (), (), rng_key=12345),
        RowParams(1.2, 0, 1.0, 0, (), (), rng_key=0),
    ]
    bitmask = np.array([[-1, 7]], dtype=np.int32)
    md = SamplingMetadata.build(params, [4, 2**33, 0], [[3, 1], [], [9]], CPU, [2], bitmask)
    assert md.temperature.tolist() == [0.0, np.float32(0.7), np.float32(1.2)]
    assert md.top_p.tolist() == [1.0, np.float32(0.9), 1.0]
    assert md.top_k.tolist() == [5, 0, 0]  # negative top_k is off, as 0
    assert md.key_words.tolist() == [rng.key_word(p.rng_key) for p in params]
    assert md.positions.tolist() == [4, 2**33, 0]
    assert md.seeds.tolist() == [rng.row_seed(p.rng_key, pos, rng.STREAM_SAMPLE) for p, pos in zip(params, [4, 2**33, 0])]
    assert md.masked_rows.tolist() == [0, 0, 2] and md.masked_token_ids.tolist() == [3, 1, 9]
    assert md.bitmask_rows.tolist() == [2] and md.token_bitmask.tolist() == [[-1, 7]]
    assert (md.all_greedy, md.any_top_k, md.any_top_p, md.num_masked, md.num_bitmask_rows) == (False, True, True, 3, 1)
    assert all(getattr(md, name).dtype == torch.int64 for name in INTS)
    assert md.temperature.dtype == md.top_p.dtype == torch.float32


def test_sampling_metadata_flags_of_plain_greedy_rows():
    md = SamplingMetadata.build([RowParams(0.0, 0, 1.0, 0, (), (), rng_key=1)] * 2, [0, 1], [[], []], CPU)
    assert (md.all_greedy, md.any_top_k, md.any_top_p, md.num_masked, md.num_bitmask_rows) == (True, False, False, 0, 0)
    assert md.token_bitmask.shape == (0, 0)


def test_all_greedy_rows_hash_no_seeds_and_the_other_fields_stay_in_place():
    """The sampler reads seeds only for sampled rows, so an all-greedy batch carries none (their hash
    was most of the greedy sampler graph's 58 kernels); the fields packed after them keep their
    values."""
    params = [RowParams(0.0, 3, 1.0, 0, (), (), rng_key=7)] * 2
    md = SamplingMetadata.build(params, [5, 6], [[4], []], CPU, [1], np.array([[3]], dtype=np.int32))
    assert md.seeds.shape == (0,)
    assert md.key_words.tolist() == [rng.key_word(7)] * 2 and md.positions.tolist() == [5, 6]
    assert md.masked_rows.tolist() == [0] and md.masked_token_ids.tolist() == [4] and md.bitmask_rows.tolist() == [1]
    moved = md.at_positions(torch.tensor([8, 9]))
    assert moved.positions.tolist() == [8, 9] and moved.seeds.shape == (0,)
    graph_rows = SamplingMetadata.unmasked(
        temperature=torch.zeros(2), top_p=torch.ones(2), top_k=torch.zeros(2, dtype=torch.int64),
        key_words=md.key_words, positions=md.positions, all_greedy=True, any_top_k=False, any_top_p=False,
    )  # fmt: skip
    assert graph_rows.seeds.shape == (0,)
    sampled = SamplingMetadata.build([RowParams(0.5, 0, 1.0, 0, (), (), rng_key=7)], [5], [[]], CPU)
    assert sampled.at_positions(torch.tensor([6])).seeds.tolist() == [rng.row_seed(7, 6, rng.STREAM_SAMPLE)]


def test_empty_batches_keep_the_documented_dtypes():
    md = SamplingMetadata.build([], [], [], CPU)
    assert all(getattr(md, name).dtype == torch.int64 and getattr(md, name).numel() == 0 for name in INTS)
    assert md.token_bitmask.dtype == torch.int32  # llguidance's layout, also when no row has a grammar
    assert md.temperature.dtype == md.top_p.dtype == torch.float32
    spec = SpecDecodeMetadata.build([], [], CPU)
    assert spec.draft_token_ids.shape == (0, 0) and spec.target_logits_indices.shape == (0, 1)
    assert spec.num_draft_tokens.shape == (0,)


def test_spec_decode_metadata_pads_drafts_and_points_each_slot_at_its_row():
    spec = SpecDecodeMetadata.build([[5, 6], [], [7, 8, 9]], [0, 3, 4], CPU)
    assert spec.draft_token_ids.tolist() == [[5, 6, -1], [-1, -1, -1], [7, 8, 9]]
    assert spec.num_draft_tokens.tolist() == [2, 0, 3]
    # Slots past a request's k point at its row 0 (never read as a verify row).
    assert spec.target_logits_indices.tolist() == [[0, 1, 2, 0], [3, 3, 3, 3], [4, 5, 6, 7]]
    assert spec.draft_probs is None
    assert all(t.dtype == torch.int64 for t in (spec.draft_token_ids, spec.num_draft_tokens, spec.target_logits_indices))


def test_spec_decode_metadata_without_drafts():
    """Every step without speculation: one row per request; in order, or not (rows 3 and 5)."""
    for rows in ([0, 1, 2], [3, 5, 6]):
        spec = SpecDecodeMetadata.build([[], [], []], rows, CPU)
        assert spec.target_logits_indices.tolist() == [[r] for r in rows]
        assert spec.draft_token_ids.shape == (3, 0) and spec.num_draft_tokens.tolist() == [0, 0, 0]
        assert spec.draft_token_ids.dtype == spec.num_draft_tokens.dtype == torch.int64
        assert spec.target_logits_indices.dtype == torch.int64
        # Draft probabilities pass through whichever way the indices are made.
        probs = torch.zeros(3, 0, 5)
        assert SpecDecodeMetadata.build([[], [], []], rows, CPU, draft_probs=probs).draft_probs is probs


def test_at_positions_moves_each_row_to_its_position_and_rehashes_its_seed():
    params = [RowParams(0.7, 0, 1.0, 0, (), (), rng_key=5), RowParams(1.0, 0, 1.0, 0, (), (), rng_key=2**40 + 9)]
    moved = SamplingMetadata.build(params, [3, 4], [[], []], CPU).at_positions(torch.tensor([10, 2**33]))
    assert moved.positions.tolist() == [10, 2**33]
    assert moved.seeds.tolist() == [rng.row_seed(5, 10, rng.STREAM_SAMPLE), rng.row_seed(2**40 + 9, 2**33, rng.STREAM_SAMPLE)]


def test_unmasked_rows_carry_no_mask_and_hash_their_seeds():
    """A CUDA graph's static rows: every field is the one given, the seeds are those of build (hashed
    from the same keys and positions), and no pair or grammar row is left to apply."""
    params = [RowParams(0.7, 3, 0.9, 0, (), (), rng_key=5), RowParams(0.0, 0, 1.0, 0, (), (), rng_key=2**40 + 9)]
    built = SamplingMetadata.build(params, [3, 2**33], [[], []], CPU)
    rows = SamplingMetadata.unmasked(
        temperature=built.temperature, top_p=built.top_p, top_k=built.top_k, key_words=built.key_words,
        positions=built.positions, all_greedy=False, any_top_k=True, any_top_p=True,
    )
    for name in ("temperature", "top_p", "top_k", "key_words", "positions"):
        assert getattr(rows, name) is getattr(built, name)
    assert torch.equal(rows.seeds, built.seeds)
    assert (rows.all_greedy, rows.any_top_k, rows.any_top_p) == (False, True, True)
    assert rows.num_masked == rows.num_bitmask_rows == 0
    for name in ("masked_rows", "masked_token_ids", "bitmask_rows"):
        assert getattr(rows, name).shape == (0,) and getattr(rows, name).dtype == torch.int64
    assert rows.token_bitmask.shape == (0, 0) and rows.token_bitmask.dtype == torch.int32
    greedy = SamplingMetadata.unmasked(
        temperature=built.temperature, top_p=built.top_p, top_k=built.top_k, key_words=built.key_words,
        positions=built.positions, all_greedy=True, any_top_k=False, any_top_p=False,
    )
    assert (greedy.all_greedy, greedy.any_top_k, greedy.any_top_p) == (True, False, False)


def test_unmasked_rows_keep_their_empty_masks_on_the_rows_device():
    """On the rows' own device (a "meta" device stands in for a GPU here), never the default one."""
    meta = torch.device("meta")
    ints, floats = torch.zeros(4, dtype=torch.int64, device=meta), torch.zeros(4, device=meta)
    rows = SamplingMetadata.unmasked(
        temperature=floats, top_p=floats, top_k=ints, key_words=ints, positions=ints,
        all_greedy=False, any_top_k=False, any_top_p=False,
    )
    for name in ("seeds", "masked_rows", "masked_token_ids", "bitmask_rows", "token_bitmask"):
        assert getattr(rows, name).device == meta, name
