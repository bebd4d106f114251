"""Trained drafter heads shipped with the package: `heads/<target>/<method>/` holds config.json and
model.safetensors in vLLM's tensor names, plus COMMAND, the `refengine train-drafter` line that made
them."""

from pathlib import Path

from refengine.model.errors import ModelLoadError
from refengine.model.loader import EMBEDDED_NAME, LoadedModel, embedded_smollm2_path

HEADS_ROOT = Path(__file__).parent


def embedded_target_name(loaded: LoadedModel) -> str | None:
    """The name a loaded target was embedded under ("smollm2"), or None for any other model."""
    try:
        embedded = embedded_smollm2_path()
    except ModelLoadError:
        return None
    return EMBEDDED_NAME if Path(loaded.source.path).resolve() == embedded.resolve() else None


def shipped_head_path(target: str | LoadedModel, method: str) -> Path | None:
    """The shipped head folder for `method` on `target`, or None when none ships. `target` is a
    name given to load_model ("smollm2") or a loaded model; only the embedded targets have heads, so
    a path to some other model file finds none."""
    name = embedded_target_name(target) if isinstance(target, LoadedModel) else target
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    folder = HEADS_ROOT / name / method
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
