import os

from toy.ledger import release


def test_release_subtracts_rejections():
    assert release(5, 2) == 3


def test_the_gate_pins_openmp_to_one_thread():
    # mutmut forks every mutant from its parent; the gate must hand it OMP_NUM_THREADS=1.
    assert os.environ.get("OMP_NUM_THREADS") == "1"
