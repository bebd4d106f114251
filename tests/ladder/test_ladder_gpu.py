"""Host facts. GPU facts without a GPU: the manifest's GPU list from nvidia-smi's CSV, and NVML readings sampled beside
/metrics only for a server on this host. CI has no GPU, so nvidia-smi is a script on PATH and NVML a
module standing in for nvidia-ml-py: the one part a machine without a GPU cannot give."""

import sys
import types

from ladder_harness import fake_cmd, load_rungs

from ladder import host


def test_gpus_come_from_nvidia_smi(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 570.124.06, 143771 MiB'\necho 'NVIDIA H200, 570.124.06, 143771 MiB'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert host.gpus() == [{"name": "NVIDIA H200", "driver": "570.124.06", "memory": "143771 MiB"}] * 2
    monkeypatch.setenv("PATH", "/nonexistent")
    assert host.gpus() == []


def _nvml(util: tuple[int, ...], used_mib: tuple[int, ...]) -> types.ModuleType:
    mod = types.ModuleType("pynvml")
    mod.nvmlInit = lambda: None
    mod.nvmlDeviceGetCount = lambda: len(util)
    mod.nvmlDeviceGetHandleByIndex = lambda i: i
    mod.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=util[h])
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=used_mib[h] << 20)
    return mod


def test_nvml_series_only_for_a_local_server(fake_server, ladder, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _nvml((40, 60), (1000, 3000)))
    args = ("--c", "1", "--prompts-per-rung", "1", "--warmup", "0", "--output-len", "3", "--metrics-interval", "0.1")
    # a request of 0.3 s: the gauges are read between its send and its end (ladder.scrape.summary)
    code, out, err, run = ladder("--serve-cmd", fake_cmd({"gap": 0.15}, "{port}"), *args)
    assert code == 0, (out, err)
    series = load_rungs(run)[0]["server_metrics"]["series"]
    assert series["gpu_util_pct"] == {"mean": 50.0, "peak": 50.0}  # averaged over GPUs
    assert series["gpu_mem_used_mib"] == {"mean": 4000.0, "peak": 4000.0}  # summed over GPUs
    code, out, err, run = ladder("--base-url", fake_server(gap=0.15), *args)
    assert code == 0, (out, err)
    series = load_rungs(run)[0]["server_metrics"]["series"]
    assert series["running"] is not None  # the server's gauges were read, ...
    assert series["gpu_util_pct"] is None and series["gpu_mem_used_mib"] is None  # ... a remote server's GPUs are not ours


def test_a_run_on_an_overloaded_host_says_so(fake_server, ladder, monkeypatch):
    import json
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 32.0, 16.0))  # the one thing a test cannot make real
    code, out, err, run = ladder("--base-url", fake_server(), "--c", "1", "--prompts-per-rung", "1", "--warmup", "0",
                                 "--output-len", "3")
    assert code == 0, (out, err)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["host"]["overloaded"] is True and manifest["host"]["load_average"]["end"]["1m"] == 64.0
    assert "warning: host overloaded: 1-minute load average 64.0 at the start, 64.0 at the end" in out
    assert manifest["code"]["commit"] and manifest["code"]["dirty"] in (True, False)
