"""Builds the drafter a SpeculativeConfig names, for a loaded target model."""

from refengine.model.loader import LoadedModel
from refengine.spec.config import SpeculativeConfig
from refengine.spec.drafter import Drafter
from refengine.spec.ngram import NgramDrafter


def build_drafter(spec: SpeculativeConfig, target: LoadedModel) -> Drafter:
    if spec.method == "ngram":
        return NgramDrafter(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
    raise ValueError(f"speculative method {spec.method!r} has no drafter in this build yet")
