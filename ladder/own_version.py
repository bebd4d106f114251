"""specladder's own version, for manifests and `--version`."""

from importlib.metadata import PackageNotFoundError, version

# Run from a source tree put on PYTHONPATH (as on a GPU host with no package registry) there is no
# installed distribution to ask; the manifest still gets written, saying so, instead of a traceback.
NOT_INSTALLED = "not installed (source tree)"


def own_version() -> str:
    try:
        return version("specladder")
    except PackageNotFoundError:
        return NOT_INSTALLED
