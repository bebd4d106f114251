"""Engine keys from --metadata, the server's reports and the --serve-cmd flags, normalised for the guard."""

import sys
from pathlib import Path

from ladder import engine_info

REFENGINE_METRICS = """\
# HELP refengine:engine_info How the engine was configured.
# TYPE refengine:engine_info gauge
refengine:engine_info{model_name="m",numerics="batch_invariant",dtype="float32",weight_format="Q4_1",\
spec_method="eagle",num_speculative_tokens="3",async_scheduling="True",async_scheduling_source="method",\
max_num_seqs="8",block_size="16",num_blocks="512",device="cuda:0"} 1.0
refengine:drafter_random_init{model_name="m"} 1.0
"""

LLAMACPP_MODEL = {"id": "/m/smol.gguf", "owned_by": "llamacpp",
                  "meta": {"n_ctx": 256, "ftype": "Q4_1", "n_params": 134515008}}


def test_normalise_spellings():
    assert engine_info.normalise("dtype", "bf16") == engine_info.normalise("dtype", "torch.bfloat16") == "bfloat16"
    assert engine_info.normalise("kv_dtype", "f16") == "float16"
    assert engine_info.normalise("async_scheduling", True) == engine_info.normalise("async_scheduling", "on") == "on"
    assert engine_info.normalise("async_scheduling", "False") == "off"
    assert engine_info.normalise("max_num_seqs", "4") == 4
    assert engine_info.normalise("weight_format", "q4_1") == "Q4_1"
    assert engine_info.normalise("engine", "") is None


def test_refengine_reports_its_configuration_and_a_random_init_head():
    keys = engine_info.from_server({"id": "m", "owned_by": "refengine", "root": "/m/smol.gguf",
                                    "max_model_len": 2048}, REFENGINE_METRICS, {})
    assert keys["engine"] == "refengine" and keys["weights"] == "/m/smol.gguf" and keys["max_model_len"] == 2048
    assert (keys["spec_method"], keys["spec_k"]) == ("eagle (random-init head)", 3)
    assert (keys["dtype"], keys["weight_format"], keys["numerics"]) == ("float32", "Q4_1", "batch_invariant")
    assert (keys["async_scheduling"], keys["max_num_seqs"], keys["device"]) == ("True", "8", "cuda:0")
    assert engine_info.normalise("device", keys["device"]) == engine_info.normalise("device", "cuda") == "cuda"
    spec_off = REFENGINE_METRICS.replace('spec_method="eagle"', 'spec_method=""').replace(
        'num_speculative_tokens="3"', 'num_speculative_tokens="0"').replace("init{model_name=\"m\"} 1.0", "init 0.0")
    assert engine_info.from_server({"owned_by": "refengine"}, spec_off, {})["spec_method"] == "none"


def test_llamacpp_reports_format_context_and_slots():
    keys = engine_info.from_server(LLAMACPP_MODEL, "", {"total_slots": 4, "model_path": "/m/smol.gguf"})
    assert (keys["engine"], keys["weight_format"], keys["max_model_len"]) == ("llamacpp", "Q4_1", 256)
    assert (keys["max_num_seqs"], keys["weights"]) == (4, "/m/smol.gguf")
    assert keys["kv_dtype"] is None  # llama.cpp does not say: the launcher's flags do


def test_serve_cmd_flags():
    keys = engine_info.from_serve_cmd(
        "/venv/bin/refengine serve --model /m/smol.gguf --port 1 --max-num-seqs 4 --no-async-scheduling --device cpu "
        "--speculative-config '{\"method\": \"draft_model\", \"num_speculative_tokens\": 3}'")
    assert keys["engine"] == "refengine" and keys["weights"] == "/m/smol.gguf"
    assert (keys["spec_method"], keys["spec_k"], keys["async_scheduling"]) == ("draft_model", 3, False)
    assert (keys["dtype"], keys["kv_dtype"], keys["max_num_seqs"], keys["device"]) == ("float32", "float32", "4", "cpu")
    assert engine_info.from_serve_cmd("vllm serve org/model --dtype=bfloat16 --kv-cache-dtype fp8")["kv_dtype"] == "fp8"
    assert engine_info.from_serve_cmd("python other_server.py --port 1") == {}
    # this environment's own refengine is this install; another one's version is not known here
    own = engine_info.from_serve_cmd(f"{Path(sys.executable).parent / 'refengine'} serve")
    assert own["engine_version"].startswith("specladder ") and keys["engine_version"] is None


def test_llamacpp_launcher_flags(tmp_path):
    gguf = tmp_path / "x.gguf"  # not a GGUF file: the format stays unknown rather than guessed
    gguf.write_bytes(b"nope")
    keys = engine_info.from_serve_cmd(f"{sys.executable} -m ladder.peers.llamacpp --gguf {gguf} --port 1 "
                                      f"--slots 4 --ctx-per-slot 320 --threads 2")
    # llama.cpp pads a slot's context to a multiple of 256: 320 asked, 512 had
    assert (keys["engine"], keys["kv_dtype"], keys["max_num_seqs"], keys["max_model_len"]) == ("llama.cpp", "f16", 4, 512)
    assert keys["weight_format"] is None and keys["dtype"] is None and keys["spec_method"] == "none"


def test_resolve_precedence_metadata_then_server_then_flags():
    values, sources = engine_info.resolve({"dtype": "bf16"}, {"dtype": "float32", "engine": "refengine"},
                                          {"dtype": "float16", "engine": "x", "kv_dtype": "f16"})
    assert (values["dtype"], sources["dtype"]) == ("bfloat16", "metadata")
    assert (values["engine"], sources["engine"]) == ("refengine", "server")
    assert (values["kv_dtype"], sources["kv_dtype"]) == ("float16", "flags")
    assert (values["numerics"], sources["numerics"]) == (None, None)
