"""reports/oracle.md from one or more oracle runs ("slices"). A run on a GPU host is capped in time, so
the matrix runs in `--c` slices, and a c too slow for one run in `--methods` parts of it; each writes its
verdict tables and counts as JSON beside its markdown, and `refengine oracle merge` renders the slices as
one report, with a log line per slice. A part's tables and log line name its methods."""

import collections
import json
from dataclasses import asdict, dataclass

from refengine.oracle import structured
from refengine.oracle.arms import METHODS

# What every slice of one report must share; the slices differ only in c (and where they ran), except that
# the slices at one c may split the methods between them.
SHARED = ("model", "methods", "k", "num_prompts", "max_tokens", "temperature", "seed", "variants", "structured", "prefix_cache")


class SliceMismatchError(ValueError):
    """Slices of different matrices cannot make one report."""


@dataclass(frozen=True)
class Section:
    concurrency: int
    temperature: float
    title: str
    markdown: str  # the verdict table


@dataclass(frozen=True)
class SliceReport:
    model: str
    methods: str
    k: int
    num_prompts: int
    max_tokens: int
    temperature: float | None  # None: greedy only
    seed: int
    variants: bool
    concurrency: tuple[int, ...]
    commit: str
    date: str
    host: str  # machine, CPUs, Python, torch, device, workers
    sections: tuple[Section, ...]
    labels: dict[str, int]  # verdict -> number of arms
    elapsed_s: float
    structured: bool = False  # one structured-output arm per method and front
    prefix_cache: str = "off"  # arms.PREFIX_CACHE_MODES: the shared-prefix arms with the cache on

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "SliceReport":
        data = json.loads(text)
        data["concurrency"] = tuple(data["concurrency"])
        data["sections"] = tuple(Section(**s) for s in data["sections"])
        return cls(**data)

    @property
    def num_failed(self) -> int:
        return sum(n for label, n in self.labels.items() if label != "IDENTICAL")


def summary(labels: dict[str, int], elapsed_s: float) -> str:
    failed = sum(n for label, n in labels.items() if label != "IDENTICAL")
    counts = ", ".join(f"{n} {label}" for label, n in sorted(labels.items()))
    return f"{failed} failed arm(s) of {sum(labels.values())} ({counts}) in {elapsed_s:.0f} s"


# The oracle's default --methods, whose order a merged report lists methods and a c's parts in.
CANONICAL_METHODS = ("none", *METHODS)


def _methods(s: SliceReport) -> set[str]:
    names = set(s.methods.split(", "))
    unknown = names - set(CANONICAL_METHODS)
    if unknown:
        raise SliceMismatchError(f"unknown methods {', '.join(sorted(unknown))}")
    return names


def _in_order(names: set[str]) -> list[str]:
    return [m for m in CANONICAL_METHODS if m in names]


def _matrix_methods(slices: list[SliceReport], cs: list[int]) -> list[str]:
    """The union of the slices' methods, after checking that every c's slices split it between them."""
    matrix = set().union(*map(_methods, slices))
    for c in cs:
        covered: set[str] = set()
        for s in slices:
            if c not in s.concurrency:
                continue
            shared = covered & _methods(s)
            if shared:
                raise SliceMismatchError(f"two slices ran the same c (c = {c}, methods {', '.join(_in_order(shared))})")
            covered |= _methods(s)
        if covered != matrix:
            raise SliceMismatchError(f"c = {c} lacks methods {', '.join(_in_order(matrix - covered))}")
    return _in_order(matrix)


def render(slices: list[SliceReport]) -> str:
    """One report: the shared header, a log line per slice, then every table in (c, greedy first, methods)
    order."""
    first = slices[0]
    for s in slices[1:]:
        differing = [f for f in SHARED if f != "methods" and getattr(s, f) != getattr(first, f)]
        if differing:
            raise SliceMismatchError(f"slices differ in {', '.join(differing)}; they are not one matrix")
    cs = sorted({c for s in slices for c in s.concurrency})
    methods = _matrix_methods(slices, cs)
    # A part (a slice with some of the methods) names its methods; a c's parts sort by their first method.
    parts = [_in_order(_methods(s)) for s in slices]
    named = [", ".join(p) if len(p) < len(methods) else None for p in parts]
    rank = [CANONICAL_METHODS.index(p[0]) for p in parts]
    labels = collections.Counter[str]()
    for s in slices:
        labels.update(s.labels)
    elapsed = sum(s.elapsed_s for s in slices)
    passes = f"seeded pass at temperature {first.temperature}, seed {first.seed}" if first.temperature else "greedy only"
    scope = "every arm also with chunked prefill, forced preemption and bad_words" if first.variants else "plain arms only"
    if first.prefix_cache == "only":
        scope = "prefix-cache arms only"
    if first.structured and first.prefix_cache != "only":
        scope += "; one structured-output arm per method and front"
    if first.prefix_cache != "off":
        scope += "; every method and front on the shared-prefix workload with the prefix cache on, and evicting"
    commits = sorted({s.commit for s in slices})
    header = (
        "# Token-identity oracle\n\n"
        f"Written by `refengine oracle --write-report` ({len(slices)} slice(s), merged by `refengine oracle merge`"
        f" where more than one) at commit(s) {', '.join(commits)}.\n\n"
        f"- model: {first.model}; methods: {', '.join(methods)}; k = {first.k}; c = {', '.join(map(str, cs))}\n"
        f"- {first.num_prompts} prompts x {first.max_tokens} tokens (ignore_eos); {passes}; {scope}\n"
        f"{RULES}\n"
        f"**Result: {summary(dict(labels), elapsed)}.**\n\n"
        "## Log summary\n\n"
        + "".join(
            f"- c = {', '.join(map(str, s.concurrency))}{f' (methods {named[i]})' if named[i] else ''}: "
            f"{summary(s.labels, s.elapsed_s)}; {s.date}, commit {s.commit}; {s.host}\n"
            for i, s in sorted(enumerate(slices), key=lambda e: (e[1].concurrency, rank[e[0]]))
        )
        + "\n"
    )
    tables = [
        ((sec.concurrency, sec.temperature, rank[i]), _heading_with(sec.markdown, named[i]))
        for i, s in enumerate(slices)
        for sec in s.sections
    ]
    # Sorted on the key alone, so that tables with one key keep their slice's order.
    return header + "\n".join(markdown for _, markdown in sorted(tables, key=lambda t: t[0]))


def _heading_with(markdown: str, methods: str | None) -> str:
    """The table with "; methods: ..." after its "### title" heading where it is a part's."""
    if methods is None:
        return markdown
    heading, rest = markdown.split("\n", 1)
    return f"{heading}; methods: {methods}\n{rest}"


RULES = (
    "- fronts: sync = Scheduler + step() (depth 1); async-d1 = AsyncScheduler + step(); "
    "async-d2 = AsyncScheduler + step_with_batch_queue() (depth 2). teacher / teacher-corrupt: a drafter that "
    "proposes its arm's baseline output (corrupt: draft 1 of each step altered), which must be accepted "
    "exactly as scripted at every verification.\n"
    "- Every arm, greedy and seeded, must equal the sync no-spec baseline with the same bad_words setting "
    "token for token: seeded sampling is keyed by position, and a one-hot draft is accepted exactly when it "
    "equals the target's sample there, so spec on emits what spec off emits.\n"
    "- Drafts are compared position by position: wherever an arm and its method's sync twin verified drafts "
    "at the same position after the same tokens, the drafts (their common prefix) and the acceptance within "
    "it must agree. Where drafts are verified may legitimately differ (async preempts at other steps; at "
    "depth 2 a request finishing in flight keeps its seat one frame longer): such arms say "
    "'draft placement differs'.\n"
    "- VACUOUS: a drafter without random weights that accepted fewer than max(5 tokens, 1% of its drafts) "
    "over the arm. Random heads, and every drafter of a random (tiny) target except the teacher, are exempt "
    "and labelled 'random weights: exempt'.\n"
    "- INEFFECTIVE: a variant that left no trace: a preempt arm (which evicts each request once, when it is "
    "the newest running after its first verified drafts) with no preemption of a request that had verified "
    "drafts (no drafter or a random one: emitted a token); a chunked arm with no prompt prefilled over >= 2 "
    "steps and drafting (emitting) after; a bad_words arm with no output departing from the unconstrained "
    "baseline at a banned token.\n"
    "- structured arms: request i follows a JSON schema, a regex or a choice set (i mod 3), without ignore_eos, "
    f"stop tokens, min_tokens or stop strings, and with at least {structured.MAX_TOKENS} tokens to finish in; the "
    f"JSON schema and the regex hold up to {structured.FREE_TEXT_CHARS} characters of free text. INEFFECTIVE if no "
    "verified row was masked and no draft cut by a grammar ('structured'), or if fewer "
    "than 90% of the requests were ended by their grammar ('grammar end'). WRONG if a token was one its grammar "
    "masked, a finished text does not parse or match, or (greedy) a token is not the argmax under the mask.\n"
    "- prefix_cache arms run the shared-prefix workload (each prompt behind one 32-token prefix of the prompts' "
    "own tokens, then every prompt again whole) with the prefix cache on, against the sync no-spec baseline of "
    "the same workload with the cache off (shared_prefix); every other arm runs with the cache off. INEFFECTIVE "
    "if no prompt token was served from the cache ('prefix cache'); evict arms have a pool of exactly c "
    "requests' blocks and are INEFFECTIVE without an evicted cached block ('eviction').\n"
    "- LOW-CONCURRENCY: an arm that never ran c requests at once (column 'peak').\n"
    "- Request 0 of every arm has a stop token (the second token the baseline emits without it) and "
    "min_tokens = max_tokens / 2, so the min_tokens mask bites at position 1 in every arm; request 1 has a stop "
    "string (the text of two tokens it emits without it, from half way on).\n"
    "- WRONG: an absolute check failed: a stop token before min_tokens, output going on after a stop token or "
    "string, a text not cut exactly where the stop string begins, max_tokens not exact without a stop, a banned sequence in the output, or (greedy) a token that is not the "
    "argmax of a fresh single-sequence forward of the target on the same prefix, with the same constraints "
    "(every output position is checked; column 'argmax checked').\n"
)

