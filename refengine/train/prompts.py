"""Seeded, varied prompts for self-distillation, from text that ships with Python: chat instructions
built from word lists, functions from standard-library modules, and paragraphs of Python's
documentation topics (`pydoc_data.topics`). Nothing is downloaded.

Every pool is split once, by a fixed rule, into a training part and a held-out part (every fifth
subject, coding task, module and documentation topic), so held-out prompts share no subject, task,
source file or topic with the prompts a head was trained on.
"""

import ast
import inspect
import pydoc_data.topics
import random
import textwrap
from dataclasses import dataclass
from functools import cache
from importlib import import_module

SUBJECTS = (
    "photosynthesis",
    "the water cycle",
    "black holes",
    "volcanoes",
    "the immune system",
    "compound interest",
    "machine learning",
    "the French Revolution",
    "plate tectonics",
    "climate change",
    "the printing press",
    "vaccines",
    "electric cars",
    "honeybees",
    "the Roman Empire",
    "solar panels",
    "sleep",
    "coffee",
    "the stock market",
    "recycling",
    "the human heart",
    "rainbows",
    "the internet",
    "chess",
    "gardening",
    "the moon landing",
    "earthquakes",
    "bread baking",
    "public libraries",
    "wind turbines",
    "the ocean tides",
    "the Renaissance",
    "inflation",
    "DNA",
    "the Olympic Games",
    "time management",
    "bicycles",
    "glaciers",
    "the periodic table",
    "friendship",
    "healthy breakfasts",
    "the Silk Road",
    "password security",
    "origami",
    "the Great Wall of China",
    "electricity",
    "dinosaurs",
    "learning a new language",
    "coral reefs",
    "the theory of evolution",
    "jazz music",
    "urban planning",
    "rainforests",
    "magnets",
    "budgeting",
    "the pyramids of Egypt",
    "public speaking",
    "antibiotics",
    "the solar system",
    "remote work",
    "composting",
    "lighthouses",
    "the history of chocolate",
    "hiking safety",
    "bridges",
    "the human brain",
    "cloud computing",
    "penguins",
    "the first airplanes",
    "meditation",
    "tea",
    "recycled plastic",
    "the metric system",
    "thunderstorms",
    "open source software",
    "mountain climbing",
    "the violin",
    "deserts",
    "nutrition labels",
    "3D printing",
    "traffic lights",
    "wolves",
)

TEMPLATES = (
    "Explain {s} in simple terms.",
    "Write a short paragraph about {s}.",
    "Give me three interesting facts about {s}.",
    "What are the main advantages and disadvantages of {s}?",
    "Write a short poem about {s}.",
    "How would you explain {s} to a ten-year-old?",
    "Summarize the history of {s} in a few sentences.",
    "List five questions a student might ask about {s}, with short answers.",
    "Write a friendly email inviting a colleague to a talk about {s}.",
    "What is a common misconception about {s}?",
    "Write the opening of a blog post about {s}.",
    "Describe {s} step by step.",
    "Why is {s} important? Answer briefly.",
    "Write a short story in which {s} plays a central role.",
    "Compare {s} with something from everyday life.",
    "Create a quiz with three multiple-choice questions about {s}.",
)

CODING_TASKS = (
    "reverses a string",
    "checks whether a number is prime",
    "computes the factorial of n",
    "returns the n-th Fibonacci number",
    "merges two sorted lists",
    "counts the words in a text",
    "removes duplicates from a list while keeping order",
    "finds the largest element in a list",
    "checks whether a string is a palindrome",
    "converts Celsius to Fahrenheit",
    "flattens a nested list",
    "computes the average of a list of numbers",
    "sorts a list of dictionaries by a key",
    "reads a CSV file and returns its rows",
    "computes the greatest common divisor of two numbers",
    "implements binary search",
    "transposes a matrix",
    "counts vowels in a string",
    "groups words by their first letter",
    "validates an email address with a regular expression",
    "implements a simple stack class",
    "returns the intersection of two lists",
    "computes the median of a list",
    "capitalizes every word in a sentence",
    "generates all permutations of a list",
    "implements bubble sort",
    "converts a Roman numeral to an integer",
    "checks whether two words are anagrams",
    "finds the second smallest number in a list",
    "implements a queue with two stacks",
    "computes the sum of the digits of a number",
    "chunks a list into pieces of size n",
    "parses a date string into a datetime object",
    "counts the frequency of each character",
    "implements a least-recently-used cache",
    "rotates a list by k positions",
    "returns the longest common prefix of a list of strings",
    "computes the power set of a set",
    "checks whether parentheses in a string are balanced",
    "converts a number to binary",
)

CODE_MODULES = (
    "textwrap",
    "heapq",
    "bisect",
    "fractions",
    "statistics",
    "csv",
    "difflib",
    "shlex",
    "string",
    "calendar",
    "functools",
    "dataclasses",
    "random",
    "colorsys",
    "graphlib",
    "pprint",
    "queue",
    "sched",
    "fnmatch",
    "glob",
    "json.encoder",
    "json.decoder",
    "base64",
    "gettext",
    "html",
    "ipaddress",
    "locale",
    "netrc",
    "numbers",
    "operator",
    "optparse",
    "pathlib",
    "pickletools",
    "platform",
    "plistlib",
    "quopri",
    "reprlib",
    "secrets",
    "selectors",
    "shutil",
    "smtplib",
    "stringprep",
    "tabnanny",
    "tempfile",
    "timeit",
    "tokenize",
    "trace",
    "uuid",
    "wave",
    "weakref",
    "zipapp",
    "argparse",
)

CODE_ASKS = (
    "Explain what this Python function does:\n\n```python\n{c}\n```",
    "Write a docstring for this function:\n\n```python\n{c}\n```",
    "How could this code be improved?\n\n```python\n{c}\n```",
)

TEXT_ASKS = (
    "Summarize the following text in two sentences:\n\n{t}",
    "Explain the following passage to a beginner:\n\n{t}",
    "Write three quiz questions based on this text:\n\n{t}",
)

HELD_OUT_EVERY = 5  # item i of a pool is held out when i % 5 == 4
MAX_CHARS = 900


@dataclass(frozen=True, slots=True)
class Prompt:
    """`text` is a chat message when `chat`, else raw text to continue."""

    kind: str  # instruction, coding, code-ask, text-ask, code, prose
    text: str
    chat: bool


def _split(pool, held_out: bool) -> list:
    return [x for i, x in enumerate(pool) if (i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1) == held_out]


@cache
def _functions(module_name: str) -> tuple[str, ...]:
    """Source of the module's functions and methods of 4 to 30 lines, in file order."""
    try:
        source = inspect.getsource(import_module(module_name))
    except (ImportError, OSError, TypeError):
        return ()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and 4 <= node.end_lineno - node.lineno < 30
        ):
            segment = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
            if len(segment) <= MAX_CHARS:
                found.append(segment)
    return tuple(found)


@cache
def _paragraphs(topic: str) -> tuple[str, ...]:
    """Prose paragraphs of a documentation topic: several lines of sentences, no grammar or code."""
    paragraphs = []
    for block in pydoc_data.topics.topics[topic].split("\n\n"):
        text = " ".join(line.strip() for line in block.splitlines())
        if 200 <= len(text) <= MAX_CHARS and not block.startswith(" ") and "::=" not in text and ". " in text:
            paragraphs.append(text)
    return tuple(paragraphs)


def _disjoint(pool, items, held_out: bool) -> list[str]:
    """The items of one part of the pool; held-out drops any item the training part also has (some
    documentation topics repeat each other's paragraphs)."""
    training = [x for part in _split(pool, False) for x in items(part)]
    if not held_out:
        return training
    seen = set(training)
    return [x for part in _split(pool, True) for x in items(part) if x not in seen]


def _code_pool(held_out: bool) -> list[str]:
    return _disjoint(CODE_MODULES, _functions, held_out)


def _prose_pool(held_out: bool) -> list[str]:
    return _disjoint(sorted(pydoc_data.topics.topics), _paragraphs, held_out)


# Share of each kind in a prompt set.
MIX = (
    ("instruction", 0.40),
    ("coding", 0.15),
    ("code-ask", 0.10),
    ("text-ask", 0.10),
    ("code", 0.125),
    ("prose", 0.125),
)


def build_prompts(num: int, seed: int, *, held_out: bool = False) -> list[Prompt]:
    """`num` prompts drawn with `seed` from the training pools, or from the held-out pools."""
    rng = random.Random(seed)
    subjects, tasks = _split(SUBJECTS, held_out), _split(CODING_TASKS, held_out)
    code, prose = _code_pool(held_out), _prose_pool(held_out)
    kinds = [kind for kind, share in MIX for _ in range(round(share * num))]
    kinds = (kinds + ["instruction"] * num)[:num]
    rng.shuffle(kinds)
    prompts = []
    for kind in kinds:
        if kind == "instruction":
            prompts.append(Prompt(kind, rng.choice(TEMPLATES).format(s=rng.choice(subjects)), True))
        elif kind == "coding":
            prompts.append(Prompt(kind, f"Write a Python function that {rng.choice(tasks)}.", True))
        elif kind == "code-ask":
            prompts.append(Prompt(kind, rng.choice(CODE_ASKS).format(c=rng.choice(code)), True))
        elif kind == "text-ask":
            prompts.append(Prompt(kind, rng.choice(TEXT_ASKS).format(t=rng.choice(prose)), True))
        elif kind == "code":
            function = rng.choice(code).splitlines()
            cut = rng.randint(2, max(2, len(function) // 2))  # the signature and a few lines: continue it
            prompts.append(Prompt(kind, "\n".join(function[:cut]) + "\n", False))
        else:
            paragraph = rng.choice(prose)
            words = paragraph.split(" ")
            prompts.append(Prompt(kind, " ".join(words[: max(12, len(words) // 2)]), False))
    return prompts
