"""specladder's own version and build, for manifests, reports and `--version`."""

from refengine.version import NOT_INSTALLED, Build, build, package_version

__all__ = ["NOT_INSTALLED", "Build", "build", "own_version"]


def own_version() -> str:
    return package_version()
