"""Tokenizers from HF folders: tokenizer.json plus tokenizer_config.json."""

import json
from pathlib import Path

from tokenizers import processors

from refengine.model import build_tiny_model
from refengine.tokenizer import Tokenizer


def test_bos_follows_the_post_processor_when_the_config_is_silent(tmp_path: Path) -> None:
    """Llama 3's tokenizer_config has no add_bos_token: its tokenizer.json's post-processor adds BOS."""
    tokenizer = build_tiny_model("llama").tokenizer
    tokenizer.save_hf_folder(tmp_path)
    tokenizer_json = json.loads((tmp_path / "tokenizer.json").read_text())
    bos = "<|im_start|>"
    bos_id = tokenizer.encode(bos)[0]
    tokenizer_json["post_processor"] = json.loads(
        processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, bos_id)]).__getstate__()
    )
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del config["add_bos_token"]
    config["bos_token"] = bos
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    loaded = Tokenizer.from_hf_folder(tmp_path)
    assert loaded.add_bos and loaded.bos_token_id == bos_id
    assert loaded.encode("hi") == [bos_id, ord("h"), ord("i")]
    assert loaded.encode("hi", add_special_tokens=False) == [ord("h"), ord("i")]


def test_chat_template_file_takes_precedence(tmp_path: Path) -> None:
    tokenizer = build_tiny_model("qwen3").tokenizer
    tokenizer.save_hf_folder(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{{ messages | length }}")
    assert Tokenizer.from_hf_folder(tmp_path).apply_chat_template([]) == "0"
