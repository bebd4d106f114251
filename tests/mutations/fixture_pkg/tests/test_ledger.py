from toyledger import next_request, release


def test_release_subtracts_rejections():
    assert release(5, 2) == 3


def test_queue_is_fifo():
    assert next_request(["first", "second"]) == "first"
