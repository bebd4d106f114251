"""Secrets kept out of everything the ladder writes or prints: in a server command line, the values of key-
and token-like flags (--api-key, --hf-token, --token, ...), of *_KEY= / *_TOKEN= assignments and of
credential headers (-H "Authorization: Bearer ...", "X-Api-Key: ..."); in a URL, the password of its
userinfo (http://user:PASSWORD@host), or a userinfo of one part, which may be a token."""

import re

REDACTED = "<redacted>"

_NAME = r"(?:api[-_]?key|key|token|secret|password|passwd|credentials?)"
# quoted, or a word that is not the next flag (after "=" it may start with "-"); a shell's ; & | end it
_VALUE = r"(\"[^\"]*\"|'[^']*'|(?<==)[^\s'\";&|]+|[^\s'\";&|-][^\s'\";&|]*)"
# a flag whose last word names a secret: --api-key V, --hf-token=V, -token V (not --max-tokens, --tokenizer)
_FLAG = re.compile(rf"(?i)(?<![\w-])(--?(?:\w+[-_])*{_NAME})(=|\s+){_VALUE}")
# an environment assignment: HF_TOKEN=V, OPENAI_API_KEY=V, TOKEN=V
_ASSIGN = re.compile(rf"(?i)(?<![\w-])((?:\w+_)?{_NAME})={_VALUE}")
# a credential header: "Authorization: Bearer V", "X-Api-Key: V", "Private-Token: V"
_HEADER = re.compile(r"(?i)((?<![\w-])(?:(?:proxy-)?authorization\s*:\s*(?:(?:bearer|basic|token)\s+)?"
                     r"|[\w-]*(?:key|token|secret)\s*:\s*))([^\s'\"]+)")


def secrets_in(cmd: str) -> list[str]:
    """The secret values `cmd` holds, quotes stripped, longest first (so none is a part of another's mask)."""
    found = [m.group(3) for m in _FLAG.finditer(cmd)] + [m.group(2) for m in _ASSIGN.finditer(cmd)]
    found += [m.group(2) for m in _HEADER.finditer(cmd)] + [m.group(2) for m in _CMD_USERINFO.finditer(cmd)]
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
# a URL's userinfo anywhere in a command line (--endpoint http://user:V@host): the part that is secret, up
# to the last "@" of the word (a password with a raw "/" or "@" is masked whole, not cut at it)
_CMD_USERINFO = re.compile(r"(?<![\w+.-])([a-zA-Z][\w+.-]*://(?:[^\s/@'\":]*:)?)([^\s'\"]+)@")


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
    cmd = _HEADER.sub(lambda m: m.group(1) + REDACTED, cmd)
    cmd = _CMD_USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", cmd)
    return _ASSIGN.sub(lambda m: m.group(1) + "=" + _mask(m.group(2)), cmd)
