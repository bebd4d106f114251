"""ladder identity: the divergence finder, then two scripted fake servers whose outputs differ at a known
position (token ids, and text where a server gives no ids)."""

import json

import pytest

from ladder.cli import main
from ladder.identity import Completion, compare, first_divergence


@pytest.fixture
def identity(capsys):
    """Run `ladder identity` in-process; returns (exit code, stdout, stderr)."""
    def run(*args: str):
        with pytest.raises(SystemExit) as exc:
            main(["identity", *map(str, args)])
        cap = capsys.readouterr()
        return exc.value.code, cap.out, cap.err
    return run


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # a prefix diverges where it ends
    assert first_divergence("abc", "abd") == 2
    assert first_divergence([], []) is None


def test_compare_prefers_ids_and_shows_context():
    a = Completion(text="one two three", token_ids=[5, 6, 7, 8])
    b = Completion(text="one two four", token_ids=[5, 6, 9, 8])
    verdict = compare(4, 3, a, b)
    assert (verdict.identical, verdict.compared, verdict.position) == (False, "token_ids", 2)
    assert verdict.context.startswith("after 5 6 | A: 7 8 | B: 9 8; text from char 8: after 'one two ' | A: 'three'")
    assert verdict.line().startswith("c=4 #3  DIVERGED at token 2 (of 4 / 4 tokens)")
    text_only = compare(1, 0, Completion(text="abc"), Completion(text="abc", token_ids=[1]))
    assert (text_only.identical, text_only.compared, text_only.line()) == (True, "text", "c=1 #0  identical  (3 chars)")
    failed = compare(1, 1, Completion(error="HTTP 500: x"), Completion(text="abc"))
    assert not failed.identical and failed.line() == "c=1 #1  ERROR  A: HTTP 500: x"


def test_identical_servers_exit_zero(fake_server, identity, tmp_path):
    a, b = fake_server(), fake_server(tokens_per_chunk=3)  # chunking differs, tokens do not
    code, out, err = identity("--a", a, "--b", b, "--c", "1,4", "--prompts", "4", "--max-tokens", "12",
                              "--out", tmp_path / "v.json")
    assert (code, err) == (0, "")
    assert "compares token_ids" in out and out.count("identical  (12 tokens)") == 8
    assert out.strip().endswith("identical 8/8")
    saved = json.loads((tmp_path / "v.json").read_text())
    assert saved["verdicts"][0]["a"]["token_ids"] == [i % 5 for i in range(12)]


def test_divergence_reported_at_its_token(fake_server, identity):
    a, b = fake_server(), fake_server(diverge_at=5)
    code, out, _ = identity("--a", a, "--b", b, "--c", "1,4", "--prompts", "3", "--max-tokens", "8",
                            "--temperature", "0.8", "--seed", "7")
    assert code == 1
    lines = [line for line in out.splitlines() if "DIVERGED" in line]
    assert len(lines) == 6
    assert all("DIVERGED at token 5 (of 8 / 8 tokens): after 1 2 3 4 | A: 0 1 2 | B: 99 99 99" in line
               for line in lines)
    assert "diverged 6 (c=1 #0 at 5, c=1 #1 at 5" in out


def test_text_is_compared_where_a_server_gives_no_ids(fake_server, identity):
    a, b = fake_server(), fake_server(token_ids=False, diverge_at=5)
    code, out, _ = identity("--a", a, "--b", b, "--c", "1", "--prompts", "2", "--max-tokens", "8")
    assert code == 1
    assert "B " in out and "compares text" in out
    # tokens 0-4 are "é", "日本", " w", "ö", "€": 7 characters, so the text diverges at character 7
    assert "c=1 #0  DIVERGED at char 7 (of 12 / 10 chars): after 'é日本 wö€' | A: 'é日本 w' | B: 'ΩΩΩ'" in out


def test_unreachable_endpoint_is_a_usage_error(identity):
    code, _, err = identity("--a", "http://127.0.0.1:9", "--b", "http://127.0.0.1:9")
    assert code == 2 and err.startswith("ladder: error: cannot reach")


def test_the_api_key_is_redacted_in_the_verdict_file(fake_server, identity, tmp_path):
    a = fake_server(api_key="sekrit")
    code, _, _ = identity("--a", a, "--b", a, "--c", "1", "--prompts", "1", "--max-tokens", "4",
                          "--api-key", "sekrit", "--out", tmp_path / "v.json")
    text = (tmp_path / "v.json").read_text()
    assert code == 0 and "sekrit" not in text and json.loads(text)["config"]["api_key"] == "<set>"


def test_a_divergence_on_an_eos_token_says_so(fake_server, identity):
    a, b = fake_server(stop_after=5), fake_server()  # A's model ends at token 5, B's goes on
    code, out, _ = identity("--a", a, "--b", b, "--c", "1", "--prompts", "1", "--max-tokens", "8")
    assert code == 1 and "DIVERGED at token 5 (of 5 / 8 tokens)" in out
    assert "the divergence falls on an end-of-sequence token: A stopped there (finish_reason stop)" in out
    # with --ignore-eos A emits its EOS (id 2, no text) and goes on, as vLLM and refengine do: explained too
    code, out, _ = identity("--a", a, "--b", b, "--c", "1", "--prompts", "1", "--max-tokens", "8", "--ignore-eos")
    assert code == 1 and "DIVERGED at token 5 (of 8 / 8 tokens)" in out
    assert "A's token 5 (2) came without text: a special token, with --ignore-eos most likely end-of-sequence" in out


def test_a_failed_request_is_an_error_verdict_not_a_divergence(fake_server, identity):
    a, b = fake_server(fail_at=[0]), fake_server()
    code, out, _ = identity("--a", a, "--b", b, "--c", "1", "--prompts", "2", "--max-tokens", "4")
    assert code == 1
    assert "c=1 #0  ERROR  A: http_error: HTTP 500: " in out and "c=1 #1  identical  (4 tokens)" in out
