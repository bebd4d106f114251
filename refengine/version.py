"""specladder's build: the installed version and the git commit of the source tree it runs from.

Both the engine (its /metrics engine info) and the ladder (its manifests) report it, so that a result
names the code that produced it. The commit comes from `git describe` in the package's own source tree;
an install without one (a wheel) has none, and says so.
"""

import subprocess
from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# Run from a source tree put on PYTHONPATH (as on a GPU host with no package registry) there is no
# installed distribution to ask; the manifest still gets written, saying so, instead of a traceback.
NOT_INSTALLED = "not installed (source tree)"
SOURCE_ROOT = Path(__file__).resolve().parents[1]
# What the make targets write: a report's own plots, slices and earlier files are outputs of the code, not
# changes to it, so a report written beside another (an oracle slice after the previous one) names its tree clean.
OUTPUTS = "reports"


@dataclass(frozen=True)
class Build:
    version: str
    commit: str | None  # abbreviated hash; None outside a git checkout
    dirty: bool | None  # uncommitted changes to the checkout's code (outside OUTPUTS); None when unknown

    def describe(self) -> str:
        """One string naming the build, e.g. "specladder 0.1.0 (a1b2c3d4e5f6, dirty)"."""
        if self.commit is None:
            return f"specladder {self.version} (no git commit)"
        return f"specladder {self.version} ({self.commit}{', dirty' if self.dirty else ''})"


def package_version() -> str:
    try:
        return version("specladder")
    except PackageNotFoundError:
        return NOT_INSTALLED


def _git(*args: str) -> str | None:
    return _git_in(SOURCE_ROOT, *args)


def _git_in(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@cache
def build() -> Build:
    """This process's build; cached: the tree does not change under a running server or run."""
    if _git("rev-parse", "--show-toplevel") != str(SOURCE_ROOT):
        return Build(package_version(), None, None)  # an install outside the checkout, or a checkout's copy
    commit = _git("describe", "--always", "--abbrev=12", "--match=NO-TAGS")
    if commit is None:
        return Build(package_version(), None, None)
    return Build(package_version(), commit, is_dirty(SOURCE_ROOT))


def is_dirty(root: Path) -> bool | None:
    """Uncommitted changes to tracked files of the checkout at `root`, outside `OUTPUTS`; None when unknown."""
    changed = _git_in(root, "status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){OUTPUTS}")
    return None if changed is None else changed != ""
