"""RunStore: one run's result files, rewritten after every rung so a crash loses at most one rung.

    <out>/manifest.json   what was measured, against what, how (ladder compare's like-for-like keys)
    <out>/requests.jsonl  one record per request: raw times (seconds since manifest.epoch) and its metrics
    <out>/rungs.json      one row per rung: OK with statistics, VOID with reason and errors, or NOT_RUN
    <out>/rungs.csv       the same rows, flattened (nested keys joined with "_")
    <out>/metrics.jsonl   the server's /metrics over each phase of each rung: one line per sample
    <out>/server.log      the --serve-cmd output, when the ladder started the server

Every JSON file is RFC 8259 JSON (ladder.rfc_json): a rate of inf is written as "Infinity".
"""

import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from ladder import rfc_json
from ladder.config import SetupError
from ladder.metrics import request_fields
from ladder.records import RequestRecord
from ladder.rung import RungResult, to_dict
from ladder.scrape import Series

FILES = ("manifest.json", "requests.jsonl", "rungs.json", "rungs.csv", "server.log")  # all a run writes


class RunStore:
    def __init__(self, out_dir: Path):
        self.dir = out_dir

    def claim(self, overwrite: bool) -> None:
        """Refuse a directory that holds files already (two runs would mix in it), unless overwrite, which
        empties it first: one with a ladder run, or with nothing but ladder files (a setup that failed after
        the server command started leaves its server.log and no manifest)."""
        if not self.dir.exists() or not any(self.dir.iterdir()):
            return
        if not overwrite:
            raise SetupError(f"--out {self.dir} is not empty; pass --overwrite to replace what is there")
        ours = all(p.name in FILES for p in self.dir.iterdir())
        if not (self.dir / "manifest.json").exists() and not ours:
            raise SetupError(f"--out {self.dir} holds files that are not a ladder run; --overwrite empties only "
                             f"a ladder result directory")
        shutil.rmtree(self.dir)

    def path(self, name: str) -> Path:
        """The path of a result file; the directory appears with its first file, so a run that fails
        before it starts leaves nothing behind."""
        self.dir.mkdir(parents=True, exist_ok=True)
        return self.dir / name

    def write_manifest(self, manifest: dict) -> None:
        self.path("manifest.json").write_text(rfc_json.dumps(manifest, indent=2, default=str) + "\n")

    def append_records(self, records: Sequence[RequestRecord], epoch: float,
                       failure: Callable[[RequestRecord], str | None]) -> None:
        with open(self.path("requests.jsonl"), "a") as f:
            for rec in records:
                f.write(rfc_json.dumps(request_row(rec, epoch, failure(rec))) + "\n")

    def append_metrics(self, series: Series, rung: dict, epoch: float) -> None:
        """One line per sample: its rung (and repeat), tick (null: the closing sample), time in seconds
        since the epoch, and the readings."""
        with open(self.path("metrics.jsonl"), "a") as f:
            for sample in series.samples:
                f.write(rfc_json.dumps({**rung, "tick": sample.tick, "t": round(sample.t - epoch, 6),
                                    "values": sample.values}) + "\n")

    def write_rungs(self, rungs: Sequence[RungResult]) -> None:
        import pandas as pd  # deferred: only the writer needs it, and it is slow to import

        rows = [to_dict(r) for r in rungs]
        self.path("rungs.json").write_text(rfc_json.dumps(rows, indent=2) + "\n")
        flat = pd.json_normalize(rows, sep="_")
        for col in ("flags", "errors"):
            if col in flat:
                flat[col] = flat[col].map(lambda v: " | ".join(v) if isinstance(v, (list, tuple)) else v)
        flat.to_csv(self.path("rungs.csv"), index=False)


def request_row(rec: RequestRecord, epoch: float, failure: str | None) -> dict:
    """One line of requests.jsonl: the raw record (times in seconds since the epoch), its failure, and the
    per-request metrics from the same functions as the rung statistics (null for a failed request)."""
    row = asdict(rec)
    for key in ("t_due", "t_send", "t_end"):
        row[key] = round(row[key] - epoch, 6) if row[key] else None
    row["chunk_times"] = [round(t - epoch, 6) for t in rec.chunk_times]
    row["error"] = failure
    row.update(request_fields(rec if failure is None else None))
    return row
