"""The like-for-like guard: checked before `ladder compare` draws any table.

Workload keys decide whether the runs measured the same thing at all: the prompt texts (hash per rung), the
seed, the sampling parameters and ignore_eos, the endpoint kind, --multi-turn's sessions, a trace's schedule
(its due times and speedup), and the realised lengths from the servers'
usage. Input lengths may differ by INPUT_TOLERANCE tokens, because chat templates and BOS handling differ
between servers even for identical prompt texts; with ignore_eos the output lengths must be equal. Runs whose
workloads differ are refused unless the caller allows the mismatch. Without ignore_eos each engine chooses
where its replies stop (two engines of different numerics stop at different tokens on the same greedy
prompt), so output lengths that differ are listed by `stop_differences`, not refused.

Engine keys (ladder.config.ENGINE_KEYS) say what was measured: runs that differ in any of them are put side
by side only under a "not like-for-like" banner that lists each difference.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ladder.config import ENGINE_KEYS
from ladder.runs import Run

INPUT_TOLERANCE = 2  # tokens


@dataclass(frozen=True)
class Difference:
    key: str
    values: tuple[tuple[str, str], ...]  # (run label, value as shown)
    note: str = ""

    def line(self) -> str:
        shown = ", ".join(f"{label} = {value}" for label, value in self.values)
        return f"{self.key}: {shown}" + (f" ({self.note})" if self.note else "")


def _show(value: object) -> str:
    return "unknown" if value is None else str(value)


def _differs(key: str, runs: Sequence[Run], get: Callable[[Run], object], note: str = "") -> list[Difference]:
    values = [get(r) for r in runs]
    if all(v == values[0] for v in values):
        return []
    return [Difference(key, tuple((r.label, _show(v)) for r, v in zip(runs, values)), note)]


def engine_differences(runs: Sequence[Run], same_build: bool = False) -> list[Difference]:
    """Every engine key on which the runs disagree. An unknown value never counts as equal to a known one,
    and a key no run knows is reported by `unverified_engine_keys` instead. Two builds of one engine differ
    in engine_version (its commit included) unless the caller asserts they run alike (same_build)."""
    out: list[Difference] = []
    for key in ENGINE_KEYS:
        if same_build and key == "engine_version":
            continue
        out += _differs(key, runs, lambda r, k=key: r.engine.get(k))
    return out


def unverified_engine_keys(runs: Sequence[Run]) -> list[str]:
    return [k for k in ENGINE_KEYS if all(r.engine.get(k) is None for r in runs)]


def _lengths(run: Run, c: int, key: str) -> tuple[int, int] | None:
    row = run.ok(c)
    stats = (row.stats or {}).get(key) if row else None
    if row and key == "input_tokens" and ((run.workload.get("multi_turn") or {}).get("reply") == "server"):
        # NOTE: a later turn's prompt holds the replies of the server that ran it; the first turn's are the
        # same texts on every server.
        stats = ((row.turns or {}).get("1") or {}).get(key)
    return (stats["min"], stats["max"]) if stats else None


def _length_differences(runs: Sequence[Run], c: float, rung: str, key: str, name: str,
                        tolerance: int) -> list[Difference]:
    measured = [(r, span) for r in runs if (span := _lengths(r, c, key)) is not None]
    if len(measured) < 2:
        return []
    # Each end of the spans across runs: a dataset's prompts vary in length inside one run, so the spread
    # of lengths within a run says nothing about whether the runs agree.
    shortest = [span[0] for _, span in measured]
    longest = [span[1] for _, span in measured]
    if max(shortest) - min(shortest) <= tolerance and max(longest) - min(longest) <= tolerance:
        return []
    note = f"must match within ±{tolerance}" if tolerance else "must match exactly"
    return [Difference(f"{name} at {rung}", tuple((r.label, f"{a}" if a == b else f"{a}–{b}")
                                                 for r, (a, b) in measured), note)]


def _dataset(run: Run) -> str | None:
    """The dataset as the guard compares it: not its path, which differs between machines."""
    d = run.workload.get("dataset")
    if not d:
        return None
    return ", ".join(f"{k}={d[k]}" for k in ("kind", "num_records", "max_input_len", "max_total_len") if d.get(k) is not None)


def workload_differences(runs: Sequence[Run]) -> list[Difference]:
    out: list[Difference] = []
    for key in ("seed", "input_len", "output_len", "length_dist", "sampling", "endpoint_kind", "multi_turn", "trace"):
        out += _differs(key, runs, lambda r, k=key: r.workload.get(k))
    out += _differs("dataset", runs, _dataset, "kind, record count and prompt filter")
    out += _differs("goodput SLOs", runs, lambda r: r.slos, "goodput counts the requests meeting them")
    loads = _differs("load", runs, lambda r: "request rate" if _open_loop(r) else "concurrency",
                     "a rate rung and a concurrency rung do not measure the same thing")
    out += loads
    if loads:
        return out  # c = 2 and 2 req/s are different rungs: none of them is compared with another
    # NOTE: prompts sized by probing differ only between servers that count tokens differently
    sizing = (", --tokenizer sizes them alike" if engine_differences(runs) else "")
    for c in sorted(set.intersection(*(set(r.rungs) for r in runs))):
        rung = f"rate={c:g}" if _open_loop(runs[0]) else f"c={c:g}"
        counted = [r for r in runs if r.rungs[c].num_measured is not None]  # OK rows say how many they sent
        counts = _differs(f"measured requests at {rung}", counted, lambda r, c=c: r.rungs[c].num_measured,
                          "different prompt counts (--prompts-per-rung, --prompts-per-concurrency)")
        out += counts
        out += [] if counts else _differs(f"prompt texts at {rung}", runs,
                        lambda r, c=c: _rung_hash(r, c), "sha256 of the measured requests, nonce excluded; random "
                        f"prompts sized by probing differ between servers{sizing}")
        out += _length_differences(runs, c, rung, "input_tokens", "input tokens", INPUT_TOLERANCE)
        if _ignore_eos(runs[0]):  # the sampling key above already refused runs that disagree on it
            out += _length_differences(runs, c, rung, "output_tokens", "output tokens", 0)
    return out


def _ignore_eos(run: Run) -> bool:
    return bool((run.workload.get("sampling") or {}).get("ignore_eos"))


def stop_differences(runs: Sequence[Run]) -> list[Difference]:
    """Output lengths that differ between runs whose requests were free to stop at EOS: the engines' own
    choice, shown beside the tables rather than refused."""
    if any(_ignore_eos(r) for r in runs):
        return []
    out: list[Difference] = []
    for c in sorted(set.intersection(*(set(r.rungs) for r in runs))):
        rung = f"rate={c:g}" if _open_loop(runs[0]) else f"c={c:g}"
        out += _length_differences(runs, c, rung, "output_tokens", "output tokens", 0)
    return [Difference(d.key, d.values, "each engine stopped at its own EOS") for d in out]


def _open_loop(run: Run) -> bool:
    return "request_rate" in (run.workload.get("load") or {})


def _rung_hash(run: Run, load: float) -> str | None:
    """The rung's prompt hash: the manifest keys it as the load was written (c "2", a rate "2.0" or "2.5")."""
    hashes = run.workload.get("rung_prompt_hashes") or {}
    found = next((h for key, h in hashes.items() if float(key) == load), "")
    return found[:12] or None
