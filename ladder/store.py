"""RunStore: one run's result files, rewritten after every rung so a crash loses at most one rung.

    <out>/manifest.json   what was measured, against what, how (ladder compare's like-for-like keys)
    <out>/requests.jsonl  one raw record per request, times in seconds since manifest.epoch
    <out>/rungs.json      one row per rung: OK with statistics, VOID with reason and errors, or NOT_RUN
    <out>/rungs.csv       the same rows, flattened (nested keys joined with "_")
    <out>/server.log      the --serve-cmd output, when the ladder started the server
"""

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from ladder.records import RequestRecord
from ladder.rung import RungResult, to_dict


class RunStore:
    def __init__(self, out_dir: Path):
        self.dir = out_dir

    def path(self, name: str) -> Path:
        """The path of a result file; the directory appears with its first file, so a run that fails
        before it starts leaves nothing behind."""
        self.dir.mkdir(parents=True, exist_ok=True)
        return self.dir / name

    def write_manifest(self, manifest: dict) -> None:
        self.path("manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")

    def append_records(self, records: Sequence[RequestRecord], epoch: float) -> None:
        with open(self.path("requests.jsonl"), "a") as f:
            for rec in records:
                row = asdict(rec)
                for key in ("t_due", "t_send", "t_end"):
                    row[key] = round(row[key] - epoch, 6) if row[key] else None
                row["chunk_times"] = [round(t - epoch, 6) for t in rec.chunk_times]
                f.write(json.dumps(row) + "\n")

    def write_rungs(self, rungs: Sequence[RungResult]) -> None:
        import pandas as pd  # deferred: only the writer needs it, and it is slow to import

        rows = [to_dict(r) for r in rungs]
        self.path("rungs.json").write_text(json.dumps(rows, indent=2) + "\n")
        flat = pd.json_normalize(rows, sep="_")
        for col in ("flags", "errors"):
            if col in flat:
                flat[col] = flat[col].map(lambda v: " | ".join(v) if isinstance(v, (list, tuple)) else v)
        flat.to_csv(self.path("rungs.csv"), index=False)
