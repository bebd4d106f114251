"""Three forms of a secret in a server command that redaction missed (found by test_option_properties.py's
search over the forms), each kept out of the recorded command and the server's log."""

from ladder.redact import redact, redact_cmd, secrets_in


def _kept_out(cmd: str, secret: str) -> str:
    recorded = redact_cmd(cmd)
    assert secret not in recorded
    assert secret not in redact(f"args: {cmd}\nusing {secret}", secrets_in(cmd))
    return recorded


def test_a_credential_header_is_redacted():
    recorded = _kept_out('vllm serve m -H "Authorization: Bearer sk-live-42" --port 8000', "sk-live-42")
    assert recorded == 'vllm serve m -H "Authorization: Bearer <redacted>" --port 8000'
    assert _kept_out("srv --header 'X-Api-Key: k3y-77'", "k3y-77") == "srv --header 'X-Api-Key: <redacted>'"


def test_a_value_after_equals_may_start_with_a_dash():
    assert _kept_out("srv --api-key=-Zx9_Q --port 1", "-Zx9_Q") == "srv --api-key=<redacted> --port 1"


def test_a_shell_separator_ends_an_unquoted_value():
    # The secret is "V", not "V;": the log, which never holds the ";", is scrubbed of it too.
    assert _kept_out("export HF_TOKEN=hf_abc123; vllm serve m", "hf_abc123") == "export HF_TOKEN=<redacted>; vllm serve m"
