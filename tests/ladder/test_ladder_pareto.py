"""`ladder sweep --pareto` against a real `refengine serve` on tiny-qwen3 (CPU): a ladder per ISL:OSL pair
over c = 1, 2, then the front, the table and the plot. No figure here depends on the machine's speed: the
test checks which points exist and that the front is exactly the undominated ones."""

import csv
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ladder.cli import main

REFENGINE = Path(sys.executable).parent / "refengine"


@pytest.fixture
def tiny_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(REFENGINE), "serve", "--model", "tiny-qwen3", "--port", str(port), "--max-num-seqs",
                             "2", "--max-model-len", "256", "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "refengine serve did not start"
        time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_pareto_sweep_writes_its_front_table_and_plot(tiny_server, tmp_path, capsys):
    out = tmp_path / "pareto"
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "--base-url", tiny_server, "--pareto", "32:4,64:8", "--max-c", "2", "--out", str(out),
              "--prompts-per-rung", "2", "--warmup", "0", "--seed", "3", "--no-cache-bust", "--ignore-eos"])
    printed = capsys.readouterr()
    assert exc.value.code == 0, printed
    assert {p.name for p in out.iterdir()} >= {"32x4", "64x8", "pareto.csv", "pareto.md", "pareto.png"}
    rows = list(csv.DictReader(open(out / "pareto.csv")))
    assert [(r["pair"], r["concurrency"]) for r in rows] == [("32x4", "1"), ("32x4", "2"), ("64x8", "1"), ("64x8", "2")]
    pts = [(float(r["per_user_tok_s"]), float(r["output_tok_s"])) for r in rows]
    for (x, y), r in zip(pts, rows):
        dominated = any(a >= x and b >= y and (a, b) != (x, y) for a, b in pts)
        assert (r["on_front"] == "True") == (not dominated), rows
    assert any(r["on_front"] == "True" for r in rows)
    assert "on the front" in printed.out and (out / "pareto.md").read_text().count("| yes |") == sum(
        r["on_front"] == "True" for r in rows)
    # Each pair's ladder counts and tables its own rungs: `make demo-report` printed "rung 5/3" and a second
    # table that repeated the first pair's rows.
    assert printed.out.count("latency per rung") == 2
    assert len(re.findall(r"^\| c=1 +\| OK", printed.out, re.M)) == 2, printed.out
    assert not re.search(r"rung [3-9]/2", printed.out)


def test_pareto_pairs_are_checked(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "--base-url", "http://127.0.0.1:9", "--pareto", "32x4", "--max-c", "2"])
    assert exc.value.code != 0 and "expected ISL:OSL pairs" in capsys.readouterr().err


def test_the_front_is_exactly_the_undominated_points():
    from ladder.pareto import Point, front

    def p(c, user, total):
        return Point("64x32", c, user, total, 0)

    a, b, c, d, e = p(1, 50.0, 50.0), p(2, 40.0, 80.0), p(4, 30.0, 70.0), p(8, 20.0, 120.0), p(16, 40.0, 80.0)
    # c dominated by b (lower on both); b and e tie, and neither dominates the other
    assert front([a, b, c, d, e]) == {a, b, d, e}
    assert front([a]) == {a}
