"""The `refengine` command as a user meets it: cheap help, a version, lazy imports, and a one-line
error (non-zero exit, no traceback) for bad input in every subcommand."""

import subprocess
import sys
from pathlib import Path

import pytest

REFENGINE = str(Path(sys.executable).with_name("refengine"))
MUTATIONS = str(Path(sys.executable).with_name("mutations"))
HEAVY = ("torch", "fastapi", "uvicorn", "numpy")


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)


def imported_after(statement: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running `statement`."""
    probe = f"import sys; {statement}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    return run(sys.executable, "-c", probe, check=True).stdout.split()


def test_the_command_group_imports_nothing_heavy():
    assert imported_after("import refengine.cli") == []


def test_the_package_exports_its_api_lazily():
    assert imported_after("import refengine; refengine.SamplingParams; refengine.EngineConfig") == []
    assert "torch" in imported_after("from refengine import LLM")
    out = run(sys.executable, "-c", "import refengine; refengine.DoesNotExist")
    assert out.returncode != 0 and "has no attribute 'DoesNotExist'" in out.stderr


@pytest.mark.parametrize("command", [REFENGINE, MUTATIONS])
def test_version(command):
    out = run(command, "--version", check=True)
    assert out.stdout.split()[-1] == "0.1.0"


def test_oracle_help_works_without_uvicorn(tmp_path):
    """A sitecustomize that makes `import uvicorn` fail, as on a machine without it."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('uvicorn', 'fastapi'):\n"
        "            raise ImportError(f'{name} is hidden by this test')\n"
        "sys.meta_path.insert(0, _Hide())\n"
    )
    env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parents[2]}"}
    hidden = run(sys.executable, "-c", "import uvicorn", env=env)
    assert "hidden by this test" in hidden.stderr  # the hiding works, so the next check can fail
    out = run(REFENGINE, "oracle", "--help", env=env)
    assert out.returncode == 0, out.stderr
    assert "--methods" in out.stdout


# {missing} is a path that does not exist, {corrupt} a file that is no GGUF, {out} a fresh folder.
BAD_INPUT = {
    "generate-missing": ("generate --model {missing} --prompt hi", "no such file"),
    "generate-corrupt": ("generate --model {corrupt} --prompt hi", "not a readable GGUF"),
    "generate-empty-prompt": ("generate --model tiny-qwen3 --prompt", "empty"),
    "generate-graphs-on-cpu": ("generate --model tiny-qwen3 --prompt hi --device cpu --cuda-graphs", "needs a GPU"),
    "serve-graphs-on-cpu": ("serve --model tiny-qwen3 --device cpu --cuda-graphs", "needs a GPU"),
    "oracle-missing": ("oracle --model {missing} --c 1", "no such file"),
    "oracle-corrupt": ("oracle --model {corrupt} --c 1", "not a readable GGUF"),
    "train-missing": ("train-drafter --target {missing} --method eagle --out {out}", "no such file"),
    "train-corrupt": ("train-drafter --target {corrupt} --method eagle --out {out}", "not a readable GGUF"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_one_line_without_traceback(tmp_path, case):
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"not a gguf file at all")
    template, expected = BAD_INPUT[case]
    args = template.format(missing=tmp_path / "missing.gguf", corrupt=corrupt, out=tmp_path / "head").split()
    if case.endswith("empty-prompt"):
        args.append("")
    out = run(REFENGINE, *args)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), out.stderr
    assert expected in lines[0]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_device_cuda_without_a_gpu_is_one_line():
    out = run(REFENGINE, "generate", "--model", "tiny-qwen3", "--prompt", "hi", "--device", "cuda")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.strip() == "Error: --device cuda: no CUDA device is visible on this machine"


def test_generate_on_the_cpu_device_with_a_kv_budget():
    out = run(REFENGINE, "generate", "--model", "tiny-qwen3", "--prompt", "hi", "--max-tokens", "3",
              "--device", "cpu", "--no-cuda-graphs", "--kv-cache-memory-gib", "0.05")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def test_serve_help_is_parsed_without_importing_torch():
    """`refengine serve --help` took 9 s on 2 cores: torch was imported before the flags were parsed."""
    probe = ("import contextlib, io, sys\nfrom refengine.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()) as help_text:\n"
             "    main(['serve', '--help'], standalone_mode=False)\n"
             "print('--speculative-config' in help_text.getvalue(), 'torch' in sys.modules)")
    assert run(sys.executable, "-c", probe, check=True).stdout.split() == ["True", "False"]
