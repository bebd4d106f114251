"""The like-for-like engine keys of a run, gathered from three places and normalised for comparison.

Precedence per key: `--metadata` (what the person running the ladder asserts), then what the server
reports (its resolved configuration), then what the `--serve-cmd` flags say (what it was asked for).
Each key's source is kept beside its value in the manifest, so a reader can tell an asserted value from a
measured one. A key that no source knows stays None: `ladder compare` shows it as unknown, never as equal.
"""

import json
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from ladder.config import ENGINE_KEYS
from ladder.own_version import NOT_INSTALLED, build, own_version

_DTYPES = {
    "float32": "float32", "fp32": "float32", "f32": "float32", "float": "float32", "torch.float32": "float32",
    "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16", "torch.float16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16", "torch.bfloat16": "bfloat16",
}
_TRUE = {"true", "1", "on", "yes"}
_FALSE = {"false", "0", "off", "no"}
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


EngineValue = str | int | None


def normalise(key: str, value: object) -> EngineValue:
    """One spelling per meaning, so that "bf16" and "bfloat16", True and "on", or "4" and 4 compare equal."""
    if value is None or value == "":
        return None
    text = str(value).strip()
    if text.isdigit() and key != "async_scheduling":
        return int(text)
    if key in ("dtype", "kv_dtype"):
        return _DTYPES.get(text.lower(), text)
    if key == "weight_format":
        return text.upper()
    if key == "device":
        return text.split(":")[0].lower()  # the kind of device: "cuda:0" and "cuda:1" run the same code
    if key == "async_scheduling":
        low = text.lower()
        return "on" if low in _TRUE else "off" if low in _FALSE else text
    return text


def _info_labels(metrics_text: str, name: str) -> dict[str, str]:
    """The labels of the first sample of a Prometheus info metric, or {}."""
    for line in metrics_text.splitlines():
        if line.startswith(name + "{"):
            return dict(_LABEL.findall(line.split("}", 1)[0]))
    return {}


def _gauge(metrics_text: str, name: str) -> float | None:
    for line in metrics_text.splitlines():
        if line.startswith((name + "{", name + " ")):
            return float(line.rsplit("}", 1)[-1].split()[0] if "}" in line else line.split()[1])
    return None


def from_server(model_entry: Mapping, metrics_text: str, props: Mapping) -> dict[str, object]:
    """Engine keys from /v1/models (OpenAI fields, llama.cpp's `meta`), /metrics (refengine's
    `refengine:engine_info`, vLLM's `vllm:cache_config_info`) and /props (llama.cpp)."""
    out: dict[str, object] = {k: model_entry.get(k) for k in ENGINE_KEYS}
    out["engine"] = out["engine"] or model_entry.get("owned_by")
    meta = model_entry.get("meta") or {}
    if isinstance(meta, Mapping):
        out["weight_format"] = out["weight_format"] or meta.get("ftype")
        # llama.cpp's n_ctx here is per slot: the longest sequence one request can have.
        out["max_model_len"] = out["max_model_len"] or meta.get("n_ctx")
    if model_entry.get("owned_by") == "refengine":
        out["weights"] = out["weights"] or model_entry.get("root")
    ref = _info_labels(metrics_text, "refengine:engine_info")
    if ref:
        # refengine reports an empty method when speculation is off
        method = ref.get("spec_method") or "none"
        if _gauge(metrics_text, "refengine:drafter_random_init") == 1.0:
            method += " (random-init head)"  # no trained weights: a different drafter, not a detail
        out.update(device=ref.get("device"), numerics=ref.get("numerics"), dtype=ref.get("dtype"), weight_format=ref.get("weight_format"),
                   spec_method=method, spec_k=int(ref.get("num_speculative_tokens") or 0),
                   async_scheduling=ref.get("async_scheduling"), max_num_seqs=ref.get("max_num_seqs"),
                   engine_version=ref.get("version") or out["engine_version"])
    vllm_cache = _info_labels(metrics_text, "vllm:cache_config_info")
    if vllm_cache:
        out["kv_dtype"] = vllm_cache.get("cache_dtype")
    if props:
        out["max_num_seqs"] = out["max_num_seqs"] or props.get("total_slots")
        out["weights"] = out["weights"] or props.get("model_path")
        out["weight_format"] = out["weight_format"] or props.get("model_ftype")
    return out


def _spec(config: str) -> dict[str, object]:
    try:
        spec = json.loads(config)
    except ValueError:
        return {}
    if not isinstance(spec, dict):
        return {}
    return {"spec_method": spec.get("method"), "spec_k": spec.get("num_speculative_tokens")}


def _vllm_style(argv: list[str], engine: str) -> dict[str, object]:
    """`refengine serve` / `vllm serve` flags. Speculation is off unless --speculative-config says
    otherwise; refengine keeps its KV cache in the compute dtype and has no KV dtype flag."""
    out: dict[str, object] = {"engine": engine, "spec_method": "none", "spec_k": 0}
    if engine == "refengine":
        out.update(dtype="float32", numerics="batch_invariant")  # its documented defaults
    flags = {"--device": "device", "--dtype": "dtype", "--kv-cache-dtype": "kv_dtype", "--max-model-len": "max_model_len",
             "--max-num-seqs": "max_num_seqs", "--model": "weights"}
    for i, arg in enumerate(argv):
        name, eq, inline = arg.partition("=")
        value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
        if name in flags:
            out[flags[name]] = value
        elif name == "--speculative-config" and value is not None:
            out.update(_spec(value))
        elif arg in ("--async-scheduling", "--no-async-scheduling"):
            out["async_scheduling"] = arg == "--async-scheduling"
        elif arg in ("--batch-invariant", "--fast"):
            out["numerics"] = "batch_invariant" if arg == "--batch-invariant" else "fast"
    if engine == "refengine":
        out.setdefault("kv_dtype", out["dtype"])
        out["engine_version"] = _own_version(argv[0])
    if engine == "vllm" and len(argv) > 2 and not argv[2].startswith("-"):
        out["weights"] = out.get("weights") or argv[2]  # `vllm serve MODEL`
    return out


def _own_version(program: str) -> str | None:
    """specladder's version when `program` is this interpreter's own refengine: then it is this install."""
    if Path(program).absolute().parent != Path(sys.executable).absolute().parent:
        return None
    return None if own_version() == NOT_INSTALLED else build().describe()


def from_serve_cmd(serve_cmd: str | None) -> dict[str, object]:
    """What the server command line says about the engine keys; {} for a command it does not know."""
    if not serve_cmd:
        return {}
    try:
        argv = shlex.split(serve_cmd)
    except ValueError:
        return {}
    if len(argv) >= 2 and argv[1] == "serve" and Path(argv[0]).name in ("refengine", "vllm"):
        return _vllm_style(argv, Path(argv[0]).name)
    if "-m" in argv and argv.index("-m") + 1 < len(argv) and argv[argv.index("-m") + 1] == "ladder.peers.llamacpp":
        from ladder.peers import llamacpp  # the launcher knows the configuration it sets

        return llamacpp.engine_keys(argv[argv.index("-m") + 2:])
    return {}


def resolve(metadata: Mapping[str, str], server: Mapping[str, object],
            flags: Mapping[str, object]) -> tuple[dict[str, EngineValue], dict[str, str | None]]:
    """(values, sources): each engine key normalised, from the first source that knows it."""
    values: dict[str, EngineValue] = {}
    sources: dict[str, str | None] = {}
    for key in ENGINE_KEYS:
        values[key], sources[key] = None, None
        for source, found in (("metadata", metadata), ("server", server), ("flags", flags)):
            value = normalise(key, found.get(key))
            if value is not None:
                values[key], sources[key] = value, source
                break
    return values, sources
