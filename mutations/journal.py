"""The crash journal: written before a target is mutated, removed once it is verifiably restored.

If the runner dies mid-mutation (SIGKILL, OOM, a lost CI node) the tree is left mutated. The journal holds
everything needed to undo that without the runner: the target path, the pre-image bytes, their sha256 and
the original times, plus the runner's pid and the process group of the test run it had started.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from mutations.files import Snapshot, restore_snapshot, sha256_hex
from mutations.procs import kill_group

JOURNAL_NAME = "journal.json"


class JournalError(RuntimeError):
    """The journal cannot be honoured (unreadable, inconsistent, or its runner is still alive)."""


@dataclass(frozen=True)
class JournalEntry:
    mutant_id: str
    target: str  # absolute path, so `restore` works from any working directory
    preimage_b64: str
    sha256: str
    atime_ns: int
    mtime_ns: int
    runner_pid: int
    test_pgid: int | None = None

    def snapshot(self) -> Snapshot:
        data = base64.b64decode(self.preimage_b64)
        if sha256_hex(data) != self.sha256:
            raise JournalError(f"journal pre-image for {self.target} does not match its recorded sha256")
        return Snapshot(
            path=Path(self.target),
            data=data,
            sha256=self.sha256,
            atime_ns=self.atime_ns,
            mtime_ns=self.mtime_ns,
        )


class Journal:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / JOURNAL_NAME

    def exists(self) -> bool:
        return self.path.exists()

    def record(self, mutant_id: str, snapshot: Snapshot) -> None:
        entry = JournalEntry(
            mutant_id=mutant_id,
            target=str(snapshot.path.resolve()),
            preimage_b64=base64.b64encode(snapshot.data).decode("ascii"),
            sha256=snapshot.sha256,
            atime_ns=snapshot.atime_ns,
            mtime_ns=snapshot.mtime_ns,
            runner_pid=os.getpid(),
        )
        self._write(entry)

    def note_test_group(self, pgid: int) -> None:
        """Remember the test run's process group: it outlives a SIGKILLed runner and must be stopped too."""
        entry = self.load()
        self._write(JournalEntry(**{**asdict(entry), "test_pgid": pgid}))

    def load(self) -> JournalEntry:
        try:
            return JournalEntry(**json.loads(self.path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as exc:
            raise JournalError(f"cannot read journal {self.path}: {exc}") from exc

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def _write(self, entry: JournalEntry) -> None:
        # Write-then-rename with fsync: a kill at any instant leaves either the old or the new journal whole.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as handle:
            json.dump(asdict(entry), handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)


def recover(journal: Journal, *, force: bool = False) -> str:
    """Undo an interrupted mutation from the journal. Returns a one-line account of what was done."""
    if not journal.exists():
        return "no journal: nothing to restore"
    entry = journal.load()
    if not force and entry.runner_pid != os.getpid() and _alive(entry.runner_pid):
        raise JournalError(
            f"runner pid {entry.runner_pid} is still alive and will restore {entry.target} itself "
            "(use --force if that pid is not a mutations runner)"
        )
    if entry.test_pgid is not None:
        # A SIGKILLed runner leaves its test run orphaned, still executing the mutant.
        kill_group(entry.test_pgid)
    snapshot = entry.snapshot()
    sha_after = restore_snapshot(snapshot)
    if sha_after != snapshot.sha256:
        raise JournalError(f"{entry.target} still differs from its pre-image after restore; journal kept")
    journal.clear()
    return f"restored {entry.target} (mutant {entry.mutant_id}) to sha256 {snapshot.sha256[:12]}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed runner that its parent has not reaped yet still answers signal 0; it is dead all the same.
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
