"""Adaptive verification's policy (spec_decode/adaptive_verification.py): the K it chooses from survival by
position and a verify-cost table, torch-free and on given tables; the engine's use of it is in
tests/engine/test_adaptive_verification_engine.py.

Invariant numbers refer to docs/invariants.md.
"""

import pytest

from refengine.spec_decode.adaptive_verification import (
    PROBE_INTERVAL,
    AdaptiveVerification,
    AdaptiveVerificationError,
    VerifyCostTable,
    survival,
)
from refengine.spec_decode.metrics import SpecDecodingStats

K = 4


def table(per_draft: float, batch_sizes=(1, 8, 64)) -> VerifyCostTable:
    """A step costs 1 plus `per_draft` per draft verified per request, at every batch size."""
    return VerifyCostTable.monotone(list(batch_sizes), [[1 + per_draft * j for j in range(K + 1)] for _ in batch_sizes])


def geometric(rate: float) -> list[float]:
    return [rate ** (i + 1) for i in range(K)]


def test_low_acceptance_and_costly_verification_verify_nothing():
    policy = AdaptiveVerification(table(0.5))
    assert policy.choose(8, {f"r{i}": geometric(0.3) for i in range(8)}) == {f"r{i}": 0 for i in range(8)}


def test_high_acceptance_verifies_every_draft():
    policy = AdaptiveVerification(table(0.05))
    assert policy.choose(1, {"r": geometric(0.9)}) == {"r": K}


def test_cheap_verification_takes_low_acceptance_slots_and_costly_stops_early():
    """Memory-bound (nearly free drafts): even 0.3 pays at position 0; costlier, only the first slots pay."""
    assert AdaptiveVerification(table(0.01)).choose(1, {"r": geometric(0.3)})["r"] >= 1
    chosen = AdaptiveVerification(table(0.2)).choose(1, {"r": geometric(0.7)})["r"]
    assert 0 < chosen < K


def test_slots_compete_across_requests():
    """A confident request keeps more of its block than a doubtful one in the same step."""
    chosen = AdaptiveVerification(table(0.15)).choose(2, {"sure": geometric(0.95), "doubtful": geometric(0.3)})
    assert chosen["sure"] > chosen["doubtful"]


def test_a_request_holding_fewer_drafts_gets_no_more():
    assert AdaptiveVerification(table(0.0001)).choose(1, {"r": geometric(0.99)[:2]}) == {"r": 2}


def test_policy_takes_prefixes():
    """Invariant 61: slots are taken best first and a request's form a prefix of its drafts; survival
    estimates that rose with position would break that, and are refused."""
    policy = AdaptiveVerification(table(0.3))
    with pytest.raises(AdaptiveVerificationError, match="slot 1 chosen after 0"):
        policy.choose(1, {"r": [0.1, 0.9, 0.0, 0.0]})


def test_survival_is_non_increasing_and_learns_from_the_request():
    engine, own = SpecDecodingStats(), SpecDecodingStats()
    assert survival(own, engine, K) == [1.0] * K  # nothing seen: optimistic
    for _ in range(50):
        engine.observe_draft(K, 1)
        own.observe_draft(2, 0)  # shorter drafts: position 2 and 3 are not offered by this request
    s = survival(own, engine, K)
    assert all(a >= b for a, b in zip(s, s[1:], strict=False))
    assert s[0] < 0.1 and s[2] < 0.05


def test_a_starved_request_is_probed():
    """K = 0 for PROBE_INTERVAL steps in a row, then one draft, so its estimate can recover."""
    policy = AdaptiveVerification(table(1.0))
    chosen = [policy.choose(1, {"r": geometric(0.1)})["r"] for _ in range(PROBE_INTERVAL)]
    assert chosen == [0] * (PROBE_INTERVAL - 1) + [1]
    policy.forget("r")
    assert policy.choose(1, {"r": geometric(0.1)})["r"] == 0


def test_cost_table_is_monotone_and_interpolates():
    t = VerifyCostTable.monotone([1, 4], [[2.0, 1.0, 3.0], [1.0, 5.0, 6.0]])
    assert t.seconds == ((2.0, 2.0, 3.0), (2.0, 5.0, 6.0))
    assert t.cost(1, 1) == 2.0 and t.cost(4, 8) == 6.0
    assert t.cost(2, 2) == pytest.approx((2 / 3) * 2.0 + (1 / 3) * 5.0)
    assert t.cost(64, 64) == 5.0  # past the last batch size: its row


def test_speculative_config_flag_is_vllms_name():
    from refengine.spec_decode.config import SpeculativeConfig

    spec = SpeculativeConfig.from_json('{"method": "eagle", "num_speculative_tokens": 3, "enable_adaptive_verification": true}')
    assert spec.enable_adaptive_verification
    assert not SpeculativeConfig("eagle", 3).enable_adaptive_verification
    with pytest.raises(ValueError, match="enable_adaptive_verification must be true or false"):
        SpeculativeConfig("eagle", 3, enable_adaptive_verification="yes")
