"""The host a run measured from: CPU model, GPUs and driver where visible, and its load before and after.

A benchmark number is a property of code on a machine; the manifest keeps both. The load average is read
at the start and the end of a run: a host busier than its core count delays the client and the local
server alike, so such a run is flagged (`overloaded`) rather than silently trusted.
"""

import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


def cpu_model() -> str | None:
    """The CPU's model name (Linux /proc/cpuinfo, else what the platform says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def gpus() -> list[dict[str, str]]:
    """Name, driver and memory of each GPU nvidia-smi sees; [] without one (or without nvidia-smi)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    rows = [[c.strip() for c in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
    return [{"name": r[0], "driver": r[1], "memory": r[2]} for r in rows if len(r) == 3]


def load_average() -> dict[str, float] | None:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return None
    return {"1m": one, "5m": five, "15m": fifteen}


def overloaded(load: dict[str, float] | None, cores: int | None) -> bool | None:
    """The 1-minute load average exceeds the core count: runnable work was queueing for CPUs."""
    if load is None or not cores:
        return None
    return load["1m"] > cores


def describe() -> dict:
    """The host part of the manifest, at the start of a run (`finish` adds the end)."""
    cores = os.cpu_count()
    start = load_average()
    return {"hostname": socket.gethostname(), "platform": platform.platform(), "python": sys.version.split()[0],
            "cpu_count": cores, "cpu_model": cpu_model(), "gpus": gpus(),
            "load_average": {"start": start, "end": None}, "overloaded": overloaded(start, cores)}


def summary() -> str:
    """The host in one phrase for a report's header: CPU model and count, kernel, 1-minute load average now."""
    load = load_average()
    return (f"{cpu_model()} x{os.cpu_count()}, {platform.system()} {platform.release()}"
            + (f", 1-minute load average {load['1m']:.1f}" if load else ""))


def provenance(target: str | None) -> str:
    """A report's first line: the make target (if one ran it), this process's exact command, the build, the date
    and the host."""
    from ladder.own_version import build

    command = f"`{shlex.join(['python', *sys.argv])}`"
    return (f"Made by {f'`make {target}` ({command})' if target else command} on {build().describe()}, "
            f"{time.strftime('%Y-%m-%d')}, {summary()}.")


def finish(host: dict) -> None:
    """Record the load at the end; the flag holds when the load exceeded the cores at either end."""
    end = load_average()
    host["load_average"]["end"] = end
    flags = [overloaded(host["load_average"]["start"], host["cpu_count"]), overloaded(end, host["cpu_count"])]
    host["overloaded"] = None if all(f is None for f in flags) else any(bool(f) for f in flags)
