"""The scheduler owns each request's grammar, so the core and the structured-output package must stay
torch-free together: importing them (and building a grammar's bitmask layout) never imports torch."""

import subprocess
import sys

CODE = """
import sys
import refengine.core.async_scheduler, refengine.core.scheduler
import refengine.structured_output.manager, refengine.structured_output.backend
leaked = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print(leaked[:3])
sys.exit(1 if leaked else 0)
"""


def test_core_and_structured_output_do_not_import_torch():
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
