"""Byte-exact snapshots of a target file and the restore that undoes a mutation.

A restore is only trusted when the bytes, the mtime and the bytecode cache all agree with the pre-image:
CPython validates a cached .pyc by (source mtime in whole seconds, source size), so a byte-identical
restore that leaves the mutant's mtime behind can keep running the mutant from a stale .pyc.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Writes the pre-image back. The runner takes it as a parameter so its tests can inject a faulty writer.
RestoreWriter = Callable[[Path, bytes], None]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Snapshot:
    path: Path
    data: bytes
    sha256: str
    atime_ns: int
    mtime_ns: int


def take_snapshot(path: Path) -> Snapshot:
    stat = path.stat()
    data = path.read_bytes()
    return Snapshot(
        path=path, data=data, sha256=sha256_hex(data), atime_ns=stat.st_atime_ns, mtime_ns=stat.st_mtime_ns
    )


def write_in_place(path: Path, data: bytes) -> None:
    """Overwrite the file's contents, keeping its inode and permissions, and flush to disk."""
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def purge_bytecode(path: Path) -> None:
    """Drop the bytecode cache next to `path` so no process can load a .pyc built from other bytes."""
    shutil.rmtree(path.parent / "__pycache__", ignore_errors=True)


def restore_snapshot(snapshot: Snapshot, writer: RestoreWriter = write_in_place) -> str:
    """Write the pre-image back with its original times; return the sha256 of what is now on disk."""
    writer(snapshot.path, snapshot.data)
    os.utime(snapshot.path, ns=(snapshot.atime_ns, snapshot.mtime_ns))
    purge_bytecode(snapshot.path)
    return sha256_hex(snapshot.path.read_bytes())
