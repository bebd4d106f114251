"""GPU utilisation and memory through NVML (the optional `nvidia-ml-py`), sampled beside /metrics.

Only for a server the ladder runs on this host (--serve-cmd or the embedded one): a remote server's GPUs
are not this host's. No NVML library, or no GPU, means no GPU series; the run goes on without them.
"""

from collections.abc import Callable

MIB = 1 << 20


def sampler() -> Callable[[], dict[str, float]] | None:
    """A function reading every visible GPU (utilisation in %, used memory in MiB, summed over GPUs with
    the utilisation averaged), or None where NVML or a GPU is missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # ImportError, or NVMLError (no driver, no device): no GPU series
        return None
    if not handles:
        return None

    def read() -> dict[str, float]:
        util = [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles]
        used = [pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles]
        return {"gpu_util_pct": sum(util) / len(util), "gpu_mem_used_mib": sum(used) / MIB}

    return read
