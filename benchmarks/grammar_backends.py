"""llguidance against xgrammar on the embedded SmolLM2 tokenizer: the figures behind the grammar
backend's choice (docs/structured-output.md).

For each backend: the one-off tokenizer build, the compile time of a mid-size JSON schema (a fresh
compile each time, no cache, up to and including the first mask, since llguidance builds its lexer
lazily), and the time of one token mask along a valid instance of the schema, token by token.
llguidance runs through refengine's own backend (refengine/structured_output/); xgrammar through its
Python API, single-threaded like llguidance. A backend that is not installed is reported as such.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python benchmarks/grammar_backends.py [--repeat 10]
"""

import argparse
import importlib.metadata
import json
import platform
import statistics
import subprocess
import time
from collections.abc import Callable

import numpy as np

from refengine.model.gguf_loader import read_gguf
from refengine.model.loader import embedded_smollm2_path
from refengine.sampling_params import StructuredOutputsParams
from refengine.structured_output.backend import JSON_OPTIONS, GuidanceBackend
from refengine.structured_output.grammar import Grammar
from refengine.tokenizer import Tokenizer

# A mid-size schema: nested objects, an array of objects, enums, bounded strings and numbers, 17 properties.
SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{6}$"},
        "status": {"enum": ["pending", "paid", "shipped", "delivered", "cancelled"]},
        "created": {"type": "string", "format": "date"},
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "email": {"type": "string", "format": "email"},
                "vip": {"type": "boolean"},
            },
            "required": ["name", "email", "vip"],
            "additionalProperties": False,
        },
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 8,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "maxLength": 12},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                    "price": {"type": "number", "minimum": 0},
                },
                "required": ["sku", "quantity", "price"],
                "additionalProperties": False,
            },
        },
        "shipping": {
            "type": "object",
            "properties": {
                "method": {"enum": ["standard", "express", "pickup"]},
                "address": {"type": "string", "maxLength": 80},
            },
            "required": ["method"],
            "additionalProperties": False,
        },
        "notes": {"type": "string", "maxLength": 200},
    },
    "required": ["order_id", "status", "created", "customer", "items", "shipping"],
    "additionalProperties": False,
}
INSTANCE = {
    "order_id": "ABC-123456",
    "status": "shipped",
    "created": "2026-11-30",
    "customer": {"name": "Ada Lovelace", "email": "ada@example.org", "vip": True},
    "items": [
        {"sku": "PEN-BLUE", "quantity": 3, "price": 1.5},
        {"sku": "NOTEBOOK-A5", "quantity": 1, "price": 7.25},
    ],
    "shipping": {"method": "express", "address": "12 St James's Square, London"},
    "notes": "Leave at the front desk.",
}


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def summary(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1e3 for s in seconds)
    return {"median_ms": statistics.median(ms), "p90_ms": ms[int(0.9 * (len(ms) - 1))], "n": len(ms)}


def bench_llguidance(tokenizer: Tokenizer, vocab_size: int, tokens: list[int], repeat: int) -> dict:
    backend = GuidanceBackend(tokenizer, vocab_size)
    build, _ = timed(lambda: backend.ll_tokenizer)
    params = StructuredOutputsParams(json=SCHEMA)
    bitmask = np.full((1, (vocab_size + 31) // 32), -1, dtype=np.int32)
    compiles, masks = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        grammar = Grammar(backend.compile(params))
        grammar.fill_bitmask(bitmask, 0)
        compiles.append(time.perf_counter() - start)
        for token in tokens:
            start = time.perf_counter()
            grammar.fill_bitmask(bitmask, 0)
            masks.append(time.perf_counter() - start)
            if not grammar.accept_tokens([token]):
                raise RuntimeError(f"llguidance refused token {token}: {grammar.error}")
    return {"tokenizer_build_s": build, "compile": summary(compiles), "mask": summary(masks)}


def bench_xgrammar(tokenizer: Tokenizer, vocab_size: int, tokens: list[int], repeat: int) -> dict:
    try:
        import xgrammar as xgr
        from tokenizers import Tokenizer as Backend
        from transformers import PreTrainedTokenizerFast
    except ImportError as err:
        return {"error": f"not installed ({err})"}
    hf = PreTrainedTokenizerFast(tokenizer_object=Backend.from_str(tokenizer.to_json()))
    build, info = timed(
        lambda: xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=list(tokenizer.eos_token_ids))
    )
    schema = json.dumps(SCHEMA)
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    compiles, masks = [], []
    for _ in range(repeat):
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        start = time.perf_counter()
        compiled = compiler.compile_json_schema(
            schema,
            any_whitespace=JSON_OPTIONS["whitespace_flexible"],
            separators=(JSON_OPTIONS["item_separator"], JSON_OPTIONS["key_separator"]),
        )
        matcher = xgr.GrammarMatcher(compiled)
        matcher.fill_next_token_bitmask(bitmask)
        compiles.append(time.perf_counter() - start)
        for token in tokens:
            start = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            masks.append(time.perf_counter() - start)
            if not matcher.accept_token(token):
                raise RuntimeError(f"xgrammar refused token {token}")
    return {"tokenizer_build_s": build, "compile": summary(compiles), "mask": summary(masks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    tokenizer = Tokenizer.from_gguf_vocab(read_gguf(embedded_smollm2_path()).vocab)
    vocab_size = tokenizer.vocab_size
    text = json.dumps(INSTANCE, separators=(JSON_OPTIONS["item_separator"], JSON_OPTIONS["key_separator"]))
    tokens = tokenizer.encode(text, add_special_tokens=False)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    versions = {}
    for package in ("llguidance", "xgrammar"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    result = {
        "context": {
            "commit": commit,
            "machine": f"{platform.processor() or platform.machine()}, {platform.system()}",
            "tokenizer": "embedded SmolLM2-135M-Instruct",
            "vocab_size": vocab_size,
            "instance_tokens": len(tokens),
            "repeat": args.repeat,
            "versions": versions,
        },
        "llguidance": bench_llguidance(tokenizer, vocab_size, tokens, args.repeat),
        "xgrammar": bench_xgrammar(tokenizer, vocab_size, tokens, args.repeat),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
