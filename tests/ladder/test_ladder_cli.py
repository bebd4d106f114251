"""Bad input gets one line on stderr and exit code 2, never a traceback."""

import json
import shutil
import subprocess
import sys

import pytest

from ladder.server import free_port


def one_line_error(code, out, err) -> str:
    assert code == 2, (out, err)
    assert err.startswith("ladder: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in out + err
    return err


@pytest.mark.parametrize("flags, message", [
    (("--c", "1,x"), "Invalid value for '--c'"),
    (("--c", "1,,2"), "Invalid value for '--c'"),
    (("--c", "0,2"), "Invalid value for '--c'"),
    (("--metric-percentiles", "50,101"), "Invalid value for '--metric-percentiles'"),
    (("--metadata", "novalue"), "expected key=value"),
    (("--output-len", "1"), "Invalid value for '--output-len'"),
    (("--prompts-per-rung", "4", "--prompts-per-concurrency", "2"), "not both"),
    (("--bogus",), "No such option"),
    (("--c", "2,1,2"), "a rung appears twice"),
    (("--request-rate", "1,0"), "positive request rates"),
    (("--c", "1", "--request-rate", "2"), "exclude each other"),
    (("--max-concurrency", "2"), "caps --request-rate"),
    (("--label", "../../x"), "no path"),
    (("--c", "8", "--prompts-per-rung", "2"), "below c=8"),
    (("--goodput", "ttft=500"), "NAME:MS"),
    (("--goodput", "itl:5"), "NAME:MS"),
    (("--dataset", "csv:x"), "expected random, mix, sharegpt"),
    (("--dataset", "sharegpt:/no/such.json", "--output-len", "8"), "no such file"),
    (("--dataset", "jsonl:/dev/null", "--input-len", "8"), "--input-len sizes random prompts"),
])
def test_malformed_flags(ladder, flags, message):
    assert message in one_line_error(*ladder("--base-url", "http://127.0.0.1:9", *flags)[:3])


def test_a_url_without_a_scheme_is_one_line(ladder):
    assert "has no scheme: write http://127.0.0.1:9" in one_line_error(*ladder("--base-url", "127.0.0.1:9")[:3])


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/v1/chat/completions", "http://127.0.0.1:9/v1/completions/",
                                 "http://127.0.0.1:9/v1/models"])
def test_an_endpoint_url_as_base_url_is_refused_with_the_base(ladder, url):
    err = one_line_error(*ladder("--base-url", url)[:3])
    assert "names an endpoint, not the server: write http://127.0.0.1:9 (--backend picks" in err


def test_a_non_empty_out_is_refused_unless_overwrite(fake_server, ladder, tmp_path):
    url = fake_server()
    out = tmp_path / "reused"
    args = ("--base-url", url, "--c", "1", "--input-len", "32", "--output-len", "4", "--prompts-per-rung", "1",
            "--out", str(out))
    assert ladder(*args)[0] == 0
    assert "is not empty; pass --overwrite" in one_line_error(*ladder(*args)[:3])
    assert ladder(*args, "--overwrite")[0] == 0
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 2  # one warmup + one measured: the first run's records are gone, not appended to
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    err = one_line_error(*ladder(*args[:-1], str(tmp_path / "other"), "--overwrite")[:3])
    assert "not a ladder run" in err and (tmp_path / "other" / "notes.txt").exists()


def test_headers_are_sent_and_redacted_in_files(fake_server, ladder):
    url = fake_server(api_key="sekrit")
    code, _, _, run = ladder("--base-url", url, "--header", "Authorization=Bearer sekrit", "--header",
                             "X-Team=blue", "--c", "1", "--input-len", "32", "--output-len", "4",
                             "--prompts-per-rung", "1", "--api-key", "other")
    assert code == 0  # the header overrides the bearer token built from --api-key
    text = (run / "manifest.json").read_text()
    assert "sekrit" not in text and "blue" not in text and "other" not in text
    assert json.loads(text)["flags"]["headers"] == {"Authorization": "<set>", "X-Team": "<set>"}


def test_insecure_accepts_a_self_signed_certificate(fake_server, ladder, tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-days", "1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    url = fake_server(tls=[str(cert), str(key)]).replace("http://", "https://")
    args = ("--base-url", url, "--c", "1", "--input-len", "32", "--output-len", "4", "--prompts-per-rung", "1")
    err = one_line_error(*ladder(*args)[:3])
    assert "cannot reach" in err and "certificate" in err.lower()
    assert ladder(*args, "--insecure")[0] == 0


def test_version(capsys):
    from importlib.metadata import version

    from ladder.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out == f"ladder {version('specladder')}\n"


def test_version_from_a_source_tree_without_the_distribution(capsys, monkeypatch):
    """A GPU host without a package registry runs the ladder from the source tree on PYTHONPATH: no
    installed distribution to ask. The version says so; the run's manifest gets it instead of a traceback."""
    from importlib.metadata import PackageNotFoundError

    from ladder import own_version
    from ladder.cli import main
    from refengine import version as build

    def missing(name):  # the one behaviour the real install cannot give
        raise PackageNotFoundError(name)

    monkeypatch.setattr(build, "version", missing)
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out == f"ladder {own_version.NOT_INSTALLED}\n"


def test_unreachable_url(ladder):
    err = one_line_error(*ladder("--base-url", f"http://127.0.0.1:{free_port()}")[:3])
    assert "cannot reach" in err


def test_wrong_api_key_is_refused_by_the_server_and_named_by_its_source(fake_server, ladder, monkeypatch):
    url = fake_server(api_key="sekrit")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert ("refused a request without an API key (HTTP 401); pass --api-key or set OPENAI_API_KEY"
            in one_line_error(*ladder("--base-url", url)[:3]))
    assert ("refused the API key given with --api-key (HTTP 401)"
            in one_line_error(*ladder("--base-url", url, "--api-key", "wrong")[:3]))
    monkeypatch.setenv("OPENAI_API_KEY", "stale")
    assert ("refused the API key from $OPENAI_API_KEY (HTTP 401); fix the variable, or pass --api-key"
            in one_line_error(*ladder("--base-url", url)[:3]))
    monkeypatch.delenv("OPENAI_API_KEY")
    code, *_ = ladder("--base-url", url, "--api-key", "sekrit", "--c", "1", "--input-len", "32",
                      "--output-len", "4", "--prompts-per-rung", "1")
    assert code == 0


def test_non_openai_server(ladder, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):  # until it listens
            code, out, err, _ = ladder("--base-url", f"http://127.0.0.1:{port}")
            if "cannot reach" not in err:
                break
        assert "answered HTTP 404: not an OpenAI-compatible server?" in one_line_error(code, out, err)
    finally:
        proc.kill()
        proc.wait()


def test_console_script_prints_one_line_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "from ladder.cli import main; main()", "run", "--base-url",
                           f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    one_line_error(proc.returncode, proc.stdout, proc.stderr)
    assert not (tmp_path / "out").exists()  # nothing measured, nothing written


def test_help_documents_exit_codes(ladder, capsys):
    from ladder.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    for line in ("0  every rung OK", "1  at least one rung VOID", "2  usage error", "3  the engine died"):
        assert line in out
