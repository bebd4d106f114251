from pathlib import Path

import pytest
from mutations_helpers import copy_fixture

# Collected only through a temporary copy, by the runner under test.
collect_ignore = ["fixture_pkg", "mutmut_project"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return copy_fixture(tmp_path / "project")
