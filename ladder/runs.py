"""A finished (or interrupted) run read back from its result directory: manifest.json + rungs.json only.

`ladder compare` works from these two files alone; requests.jsonl is not needed.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ladder import rfc_json
from ladder.config import ENGINE_KEYS, SetupError


@dataclass(frozen=True)
class RungRow:
    """One row of rungs.json. `stats`, `audit` and `spec` exist only on an OK row."""

    concurrency: int
    request_rate: float | None  # open-loop rungs are keyed by rate
    status: str  # "OK" | "VOID" | "NOT_RUN"
    flags: tuple[str, ...]
    reason: str | None
    num_ok: int | None
    num_failed: int | None
    errors: tuple[str, ...]
    prompt_hash: str | None
    stats: dict | None
    audit: dict | None
    spec: dict | None
    peak_in_flight: int | None = None
    lateness: dict | None = None
    prefix_cache: dict | None = None  # the server's prefix-cache counters over the rung, when it has them
    num_measured: int | None = None  # OK rows: the measured requests sent
    server_metrics: dict | None = None
    repeats: dict | None = None
    turns: dict | None = None  # --multi-turn: TTFT and lengths by turn index ("1", "2", ...)
    spec_requests: dict | None = None  # acceptance over the requests (spec_metrics.SpecDistribution)
    by_content: dict | None = None  # --dataset mix: content type -> content_types.ContentStats

    @property
    def load(self) -> float:
        return self.request_rate if self.request_rate is not None else self.concurrency

    @classmethod
    def from_dict(cls, row: dict) -> "RungRow":
        return cls(concurrency=int(row["concurrency"]), request_rate=row.get("request_rate"), status=row["status"], flags=tuple(row.get("flags") or ()),
                   reason=row.get("reason"), num_ok=row.get("num_ok"), num_failed=row.get("num_failed"),
                   errors=tuple(row.get("errors") or ()), prompt_hash=row.get("prompt_hash"),
                   stats=row.get("stats") if row["status"] == "OK" else None,
                   audit=row.get("audit"), spec=row.get("spec"), peak_in_flight=row.get("peak_in_flight"),
                   lateness=row.get("lateness"), prefix_cache=row.get("prefix_cache"),
                   num_measured=row.get("num_measured"), server_metrics=row.get("server_metrics"),
                   repeats=row.get("repeats"), turns=row.get("turns"), spec_requests=row.get("spec_requests"),
                   by_content=row.get("by_content"))


@dataclass(frozen=True)
class Run:
    label: str  # unique among the runs compared
    path: Path
    engine: dict[str, str | int | None]
    engine_sources: dict[str, str | None]
    workload: dict
    definitions: dict[str, str]
    flags: dict  # the run's RunConfig as recorded
    rungs: dict[float, RungRow]  # by load (concurrency, or request rate in open loop), in ladder order
    code: dict | None = None  # the ladder's build: version, commit, dirty (manifests before it have none)
    host: dict | None = None
    interrupted: bool = False  # stopped by SIGINT or SIGTERM before its last rung

    @property
    def slos(self) -> str:
        """The --goodput SLOs as vLLM spells them ("ttft:500 tpot:50"), or "none"."""
        goodput = self.flags.get("goodput") or {}
        return " ".join(f"{name}:{ms:g}" for name, ms in sorted(goodput.items())) or "none"

    def ok(self, c: float) -> RungRow | None:
        row = self.rungs.get(c)
        return row if row is not None and row.status == "OK" else None


def load_run(path: Path, label: str | None = None) -> Run:
    try:
        manifest = rfc_json.loads((path / "manifest.json").read_text())
        rows = rfc_json.loads((path / "rungs.json").read_text())
    except FileNotFoundError as e:
        raise SetupError(f"{path} is not a ladder result directory: no {Path(e.filename).name}") from e
    except ValueError as e:
        raise SetupError(f"{path}: unreadable result file: {e}") from e
    engine = manifest.get("engine") or {}
    return Run(label=label or manifest.get("label") or path.name, path=path,
               engine={k: engine.get(k) for k in ENGINE_KEYS},
               engine_sources=manifest.get("engine_sources") or {},
               workload=manifest.get("workload") or {}, definitions=manifest.get("definitions") or {},
               flags=manifest.get("flags") or {},
               rungs={r.load: r for r in map(RungRow.from_dict, rows)},
               interrupted=bool((manifest.get("result") or {}).get("interrupted")),
               code=manifest.get("code"), host=manifest.get("host"))


def load_runs(paths: Sequence[Path]) -> list[Run]:
    """Runs labelled by their manifest label; where two share one, by their directory name instead."""
    runs = [load_run(p) for p in paths]
    labels = [r.label for r in runs]
    if len(set(labels)) == len(labels):
        return runs
    names = [p.name if labels.count(r.label) > 1 else r.label for p, r in zip(paths, runs)]
    if len(set(names)) != len(names):
        raise SetupError(f"two runs share a label and a directory name: {', '.join(map(str, paths))}")
    return [load_run(p, n) for p, n in zip(paths, names)]


def concurrencies(runs: Sequence[Run]) -> list[int]:
    """Every rung of any run, ascending."""
    return sorted({c for r in runs for c in r.rungs})
