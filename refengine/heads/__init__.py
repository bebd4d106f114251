"""Trained drafter heads shipped with the package: `heads/<target>/<method>/` holds config.json and
model.safetensors in vLLM's tensor names, plus COMMAND, the `refengine train-drafter` line that made
them."""

from pathlib import Path

HEADS_ROOT = Path(__file__).parent


def shipped_head_path(target_name: str, method: str) -> Path | None:
    """The shipped head folder for `method` on the target called `target_name` (the name given to
    load_model, e.g. "smollm2"), or None when none ships. A path to a model file is not a name: only
    the embedded targets have shipped heads."""
    if not target_name or "/" in target_name or "\\" in target_name or target_name.startswith("."):
        return None
    folder = HEADS_ROOT / target_name / method
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        return folder
    return None


def shipped_heads() -> dict[tuple[str, str], Path]:
    """Every shipped head, keyed by (target name, method)."""
    return {
        (config.parent.parent.name, config.parent.name): config.parent
        for config in sorted(HEADS_ROOT.glob("*/*/config.json"))
        if any(config.parent.glob("*.safetensors"))
    }
