"""GPT-2's byte-level spelling: each of the 256 bytes is one printable character, so byte-level BPE
vocabularies (GPT-2, Llama 3, Qwen, SmolLM2) can be read and written as text."""


def _char_to_byte() -> dict[str, int]:
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return {char: b for b, char in chars.items()}


CHAR_TO_BYTE: dict[str, int] = _char_to_byte()
