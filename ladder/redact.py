"""Secrets kept out of everything the ladder writes or prints: in a server command line, the values of key-
and token-like flags (--api-key, --hf-token, --token, ...) and of *_KEY= / *_TOKEN= assignments; in a URL,
the password of its userinfo (http://user:PASSWORD@host), or a userinfo of one part, which may be a token."""

import re

REDACTED = "<redacted>"

_NAME = r"(?:api[-_]?key|key|token|secret|password|passwd|credentials?)"
_VALUE = r"(\"[^\"]*\"|'[^']*'|[^\s'\"-][^\s'\"]*)"  # quoted, or a word that is not the next flag
# a flag whose last word names a secret: --api-key V, --hf-token=V, -token V (not --max-tokens, --tokenizer)
_FLAG = re.compile(rf"(?i)(?<![\w-])(--?(?:\w+[-_])*{_NAME})(=|\s+){_VALUE}")
# an environment assignment: HF_TOKEN=V, OPENAI_API_KEY=V, TOKEN=V
_ASSIGN = re.compile(rf"(?i)(?<![\w-])((?:\w+_)?{_NAME})={_VALUE}")


def secrets_in(cmd: str) -> list[str]:
    """The secret values `cmd` holds, quotes stripped, longest first (so none is a part of another's mask)."""
    found = [m.group(3) for m in _FLAG.finditer(cmd)] + [m.group(2) for m in _ASSIGN.finditer(cmd)]
    return sorted({v.strip("'\"") for v in found if v.strip("'\"")}, key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    """text with every occurrence of each secret masked (a server's log may echo its arguments)."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def _mask(value: str) -> str:
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{quote}{REDACTED}{quote}"


_USERINFO = re.compile(r"^([a-zA-Z][\w+.-]*://)([^/]*)@")


def redact_url(url: str | None) -> str | None:
    """The URL as the ladder records and prints it: user:<redacted>@host, or <redacted>@host."""
    if url is None:
        return None
    return _USERINFO.sub(lambda m: m.group(1) + (m.group(2).split(":")[0] + ":" if ":" in m.group(2) else "")
                         + REDACTED + "@", url)


def redact_cmd(cmd: str | None) -> str | None:
    """The command as the ladder records and prints it: each secret's value masked where it stands."""
    if cmd is None:
        return None
    cmd = _FLAG.sub(lambda m: m.group(1) + m.group(2) + _mask(m.group(3)), cmd)
    return _ASSIGN.sub(lambda m: m.group(1) + "=" + _mask(m.group(2)), cmd)
