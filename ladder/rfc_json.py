"""RFC 8259 JSON for every result file. JSON has no Infinity or NaN (JavaScript, Go, serde and Python's strict
mode refuse them), yet a --request-rate of inf is a real rung key: a non-finite float is written as the string
"Infinity", "-Infinity" or "NaN" (JavaScript's own spelling), and `loads` reads those strings back as floats.
"""

import json
import math

NON_FINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _written(obj: object) -> object:
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else "Infinity" if obj > 0 else "-Infinity"
    if isinstance(obj, dict):
        return {k: _written(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_written(v) for v in obj]
    return obj


def dumps(obj: object, **kw) -> str:
    """json.dumps, non-finite floats as strings; allow_nan=False makes any that slipped through an error."""
    return json.dumps(_written(obj), allow_nan=False, **kw)


def _read(value: object) -> object:
    if isinstance(value, str):
        return NON_FINITE.get(value, value)
    return [_read(v) for v in value] if isinstance(value, list) else value


def loads(text: str) -> object:
    """json.loads, with the strings dumps wrote for non-finite floats read back as those floats."""
    return json.loads(text, object_hook=lambda obj: {k: _read(v) for k, v in obj.items()})
