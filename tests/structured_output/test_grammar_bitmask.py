"""The structured-output manager on the tiny byte tokenizer: each verified row's bitmask is the grammar's
mask after that row's preceding drafts, the tentative advance is rolled back exactly, placeholders
never advance it, and bitmasks apply to logits on the device in one path (invariant 25,
docs/invariants.md)."""

import numpy as np
import pytest
import torch

from refengine.sample.metadata import RowParams, SamplingMetadata
from refengine.sample.sampler import apply_masks, unpack_bitmask
from refengine.sampling_params import StructuredOutputsParams
from refengine.structured_output.backend import GrammarError
from refengine.structured_output.request import StructuredOutputRequest

CHOICE = StructuredOutputsParams(choice=["abc", "abd", "xyz"])


def allowed(bitmask: np.ndarray, row: int, vocab_size: int) -> set[int]:
    return {t for t in range(vocab_size) if (int(bitmask[row, t // 32]) >> (t % 32)) & 1}


def structured_request(manager, output: list[int] = ()) -> StructuredOutputRequest:
    """A request's grammar that has consumed its committed `output`."""
    structured = manager.request(CHOICE)
    structured.grammar.accept_tokens(output)
    return structured


def mask_after(manager, prefix: list[int]) -> set[int]:
    """The reference: a fresh matcher advanced through `prefix`, then its mask."""
    grammar = manager.request(CHOICE).grammar
    assert grammar.accept_tokens(prefix)
    bitmask = np.full((1, (manager.vocab_size + 31) // 32), -1, dtype=np.int32)
    grammar.fill_bitmask(bitmask, 0)
    return allowed(bitmask, 0, manager.vocab_size)


def test_each_row_is_masked_through_its_preceding_drafts_and_the_advance_rolls_back(manager):
    a, b, c = (ord(ch) for ch in "abc")
    structured = structured_request(manager)
    out = manager.grammar_bitmask({"r": structured}, {"r": [a, b, c]})
    assert out.rows == {"r": (0, 4)}
    for j, prefix in enumerate([[], [a], [a, b], [a, b, c]]):
        assert allowed(out.grammar_bitmask, j, manager.vocab_size) == mask_after(manager, prefix), j
    assert allowed(out.grammar_bitmask, 1, manager.vocab_size) == {b}
    assert allowed(out.grammar_bitmask, 2, manager.vocab_size) == {c, ord("d")}
    # Rolled back exactly: the matcher holds the committed output only, and accepts it going on.
    grammar = structured.grammar
    assert grammar.num_processed_tokens == 0
    assert grammar.accept_tokens([ord("x"), ord("y"), ord("z")]) and grammar.is_terminated()


def test_forbidden_drafts_and_placeholders_stop_the_advance(manager):
    a, b = ord("a"), ord("b")
    structured = structured_request(manager, [a])
    assert structured.grammar.validate_tokens([b, ord("q"), ord("c")]) == 1
    out = manager.grammar_bitmask({"r": structured}, {"r": [b, ord("q"), ord("c")]})
    # Row 2 follows the forbidden "q": it is never emitted from, and keeps the state after "b".
    assert [allowed(out.grammar_bitmask, j, manager.vocab_size) for j in range(4)] == [
        {b}, {ord("c"), ord("d")}, {ord("c"), ord("d")}, {ord("c"), ord("d")}
    ]
    out = manager.grammar_bitmask({"r": structured}, {"r": [-1, -1]})
    assert all(allowed(out.grammar_bitmask, j, manager.vocab_size) == {b} for j in range(3))
    assert structured.grammar.num_processed_tokens == 1


def test_drafts_past_the_grammars_end_leave_the_matcher_unharmed(manager):
    """A draft that ends the grammar, then EOS: the grammar's validation allows both, but its matcher
    stops at the end and refuses to consume anything more, EOS included, with an error state that
    rollback does not undo. The advance must stop at the end, or the committed "c" is refused next
    (found by the SmolLM2 oracle: eagle, a regex, temperature 0.8)."""
    a, b, c = (ord(ch) for ch in "abc")
    eos = manager.backend.tokenizer.eos_token_ids[0]
    structured = structured_request(manager, [a, b])
    grammar = structured.grammar
    assert grammar.validate_tokens([c, eos, a]) == 2
    out = manager.grammar_bitmask({"r": structured}, {"r": [c, eos, a]})
    # Rows after the end allow EOS only; none of them is emitted from, since "c" ends the request.
    assert [allowed(out.grammar_bitmask, j, manager.vocab_size) for j in range(4)] == [{c, ord("d")}, {eos}, {eos}, {eos}]
    assert grammar.num_processed_tokens == 2
    assert grammar.accept_tokens([c]) and grammar.is_terminated()


def test_compiles_are_cached_by_key_and_failures_name_the_problem(manager):
    # Compiled here first, or found cached: the test must not depend on which tests ran before it (mutmut
    # runs only the tests that cover a mutant, this one alone among them).
    manager.request(StructuredOutputsParams(choice=["abc", "abd", "xyz"]))
    before = manager.num_compiles
    for _ in range(3):
        manager.request(StructuredOutputsParams(choice=["abc", "abd", "xyz"]))
    assert manager.num_compiles == before
    with pytest.raises(GrammarError, match="undefined_rule"):
        manager.validate(StructuredOutputsParams(grammar="start: undefined_rule"))
    failed = manager.request(StructuredOutputsParams(regex="(unclosed"))
    failed._compiled.exception(timeout=30)
    assert "GrammarError" in failed.compile_error


def test_bitmask_applies_to_logits_on_the_device_in_one_path():
    vocab = 70  # not a multiple of 32: the tail word is partial
    logits = torch.arange(3 * vocab, dtype=torch.float32).view(3, vocab)
    bitmask = np.zeros((2, 3), dtype=np.int32)
    bitmask[0, 0] = 1 << 5  # row 0 -> logits row 2: token 5 only
    bitmask[1, 2] = 1 << 3  # row 1 -> logits row 0: token 67 only
    params = RowParams(0.0, 0, 1.0, 0, (), (), 0)
    md = SamplingMetadata.build([params] * 3, [0, 1, 2], [[], [], []], torch.device("cpu"), [2, 0], bitmask)
    out = apply_masks(logits, md)
    assert torch.isfinite(out[2]).nonzero().flatten().tolist() == [5]
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [67]
    assert torch.equal(out[1], logits[1])
    # Ids past the bitmask's width are never allowed.
    assert unpack_bitmask(torch.full((1, 1), -1, dtype=torch.int32), 40)[0].tolist() == [True] * 32 + [False] * 8
