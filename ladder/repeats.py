"""--repeats N: one rung run N times, as one row: the mean of the repeats, each metric's 95% confidence
interval and coefficient of variation across them.

A VOID repeat voids the rung (the caller stops there); only all-OK repeats are combined. The combined row
keeps every count exact: requests are summed, the shortest and longest lengths are the extremes of all
repeats (the compare guard checks them), and every other number is the mean over repeats.
"""

import math
import statistics
from dataclasses import fields, is_dataclass, replace

from ladder.rung import RungOk

# Student's t, two-sided 95% (the 0.975 quantile), by degrees of freedom; the normal 1.96 beyond 30.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
         29: 2.045, 30: 2.042}
Z_975 = 1.96


def interval(values: list[float]) -> dict:
    """Mean, the half-width of its 95% confidence interval (t with n - 1 degrees of freedom) and the
    coefficient of variation (sample standard deviation / mean)."""
    n = len(values)
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if n > 1 else 0.0
    half = T_975.get(n - 1, Z_975) * sd / math.sqrt(n) if n > 1 else None
    return {"n": n, "mean": mean, "ci95": None if half is None else [mean - half, mean + half],
            "half_width": half, "cv": sd / mean if mean else None, "values": values}


def _leaves(tree: object, prefix: str = "") -> dict[str, float]:
    """Every number of a stats tree by its dotted path, e.g. "ttft_ms.p50" (percentiles lifted one level)."""
    if is_dataclass(tree):
        tree = {f.name: getattr(tree, f.name) for f in fields(tree)}
    if isinstance(tree, dict):
        out: dict[str, float] = {}
        for key, value in tree.items():
            path = prefix if key == "percentiles" else f"{prefix}.{key}" if prefix else key
            out.update(_leaves(value, path))
        return out
    return {prefix: float(tree)} if isinstance(tree, int | float) and not isinstance(tree, bool) else {}


def _combine(values: list, name: str):
    first = values[0]
    if any(v is None for v in values):
        return None
    if is_dataclass(first):
        return type(first)(**{f.name: _combine([getattr(v, f.name) for v in values], f.name) for f in fields(first)})
    if isinstance(first, dict):
        return {k: _combine([v.get(k) for v in values], k) for k in first}
    if name == "min":
        return min(values)
    if name == "max":
        return max(values)
    if name == "num_requests":
        return sum(values)
    if isinstance(first, int | float) and not isinstance(first, bool):
        return statistics.fmean(values)
    return first


def _server_metrics(summaries: list[dict | None]) -> dict | None:
    """Per series: the mean of the repeats' means, the highest peak."""
    if any(s is None for s in summaries):
        return None
    out = dict(summaries[0])
    out["series"] = {}
    for name, first in summaries[0]["series"].items():
        per = [s["series"].get(name) for s in summaries]
        out["series"][name] = (None if first is None or any(p is None for p in per) else
                               {"mean": statistics.fmean(p["mean"] for p in per), "peak": max(p["peak"] for p in per)})
    out["num_ticks"] = sum(s["num_ticks"] for s in summaries)
    out["num_skipped"] = sum(s["num_skipped"] for s in summaries)
    out["duration_s"] = sum(s["duration_s"] for s in summaries)
    return out


def _by_content(repeats: list[RungOk]) -> dict[str, dict]:
    """--dataset mix: each content type's mean TPOT in every repeat, so a per-type speed-up keeps the spread
    of the repeats (the row's by_content pools their requests, which has none)."""
    out = {}
    for kind in (repeats[0].by_content or {}):
        tpots = [((r.by_content or {}).get(kind) or None) for r in repeats]
        if all(t is not None and t.tpot_ms is not None for t in tpots):
            out[kind] = {"tpot_ms.mean": interval([t.tpot_ms.mean for t in tpots])}
    return out


def combine(repeats: list[RungOk]) -> RungOk:
    """One row for N OK repeats of a rung, with the confidence interval of every metric."""
    first = repeats[0]
    per_metric = [_leaves(r.stats) for r in repeats]
    if any(r.spec for r in repeats) and all(r.spec for r in repeats):
        for leaves, r in zip(per_metric, repeats):
            leaves.update(_leaves(r.spec, "spec"))
    paths = [p for p in per_metric[0] if all(p in leaves for leaves in per_metric)]
    flagged = next((r for r in repeats if r.audit.flag), first)
    return replace(
        first, num_ok=sum(r.num_ok for r in repeats), stats=_combine([r.stats for r in repeats], "stats"),
        audit=flagged.audit, spec=_combine([r.spec for r in repeats], "spec"),
        num_measured=sum(r.num_measured for r in repeats), num_unsent=sum(r.num_unsent for r in repeats),
        peak_in_flight=min(r.peak_in_flight for r in repeats),
        lateness=max((r.lateness for r in repeats if r.lateness is not None), key=lambda x: x.num_late, default=None),
        server_metrics=_server_metrics([r.server_metrics for r in repeats]),
        turns=_combine([r.turns for r in repeats], "turns"),
        repeats={"n": len(repeats), "metrics": {p: interval([leaves[p] for leaves in per_metric]) for p in paths},
                 "by_content": _by_content(repeats)})
