"""The acceptance report keeps rows across invocations only on the basis they were measured on."""

from refengine.train.evaluate import Acceptance
from refengine.train.report import Row, load_rows, save_rows


def test_rows_come_back_only_on_their_own_basis(tmp_path):
    path = tmp_path / "rows.json"
    row = Row("eagle3", 4, Acceptance(10, (0.5, 0.3, 0.2, 0.1), 2.1, 2.0), 3.0)
    save_rows(path, [row], num_prompts=16, max_tokens=64)
    assert load_rows(path, num_prompts=16, max_tokens=64) == [row]
    # Another length or prompt count is another measurement: its rows must not fill this report's tables.
    assert load_rows(path, num_prompts=16, max_tokens=256) == []
    assert load_rows(path, num_prompts=32, max_tokens=64) == []
