"""Seeded request generators: what a serving run is asked to do.

Prompts are real text every machine has offline: the Python standard library that ships with the
running interpreter (docstrings for prose, source for code), tokenised by the engine's tokenizer.
The same (workload, seed, count, cap, source files, Python version, tokenizer) always yields the
same requests.

Lengths are in tokens (a prompt's count includes its leading BOS), drawn per request from a
log-normal distribution (median, sigma) clipped to [lo, hi]; sigma 0 means constant. A request's answer length is its `max_new_tokens` (it may stop
earlier at EOS). `--max-new-tokens M` rescales answer lengths by M / hi, so the longest possible
answer is M and a short (CPU-sized) run keeps the workload's mix of short and long answers; for
`fixed` M is the answer length.

| workload     | text        | prompt tokens                    | answer tokens                 |
|--------------|-------------|----------------------------------|-------------------------------|
| chat         | docstrings  | median 128, sigma 0.6, [16, 512] | median 160, sigma 0.6, [16, 512] |
| code         | source      | median 384, sigma 0.5, [64, 1024] | median 256, sigma 0.5, [32, 768] |
| long-context | source      | median 1536, sigma 0.25, [768, 3072] | median 32, sigma 0.3, [8, 64] |
| fixed        | docstrings  | 128                              | 128 (or the cap)              |
"""

from __future__ import annotations

import ast
import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from engine.corpus import stdlib_files, text_of
from engine.errors import EngineError
from engine.scheduler import Request


class Encoder(Protocol):
    bos_id: int

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class Lengths:
    """A clipped log-normal length distribution in tokens (sigma 0: always the median)."""

    median: int
    sigma: float
    lo: int
    hi: int

    def draw(self, rng: random.Random) -> int:
        if self.sigma == 0:
            return self.median
        value = round(rng.lognormvariate(math.log(self.median), self.sigma))
        return min(max(value, self.lo), self.hi)


@dataclass(frozen=True)
class Workload:
    """One request generator: where its prompt text comes from and how long prompts and answers are."""

    name: str
    text: str  # "docstrings" (prose) or "source" (code)
    prompt: Lengths
    answer: Lengths


WORKLOADS = {w.name: w for w in (
    Workload("chat", "docstrings", Lengths(128, 0.6, 16, 512), Lengths(160, 0.6, 16, 512)),
    Workload("code", "source", Lengths(384, 0.5, 64, 1024), Lengths(256, 0.5, 32, 768)),
    Workload("long-context", "source", Lengths(1536, 0.25, 768, 3072), Lengths(32, 0.3, 8, 64)),
    Workload("fixed", "docstrings", Lengths(128, 0, 128, 128), Lengths(128, 0, 128, 128)),
)}


def generate(name: str, count: int, seed: int, tokenizer: Encoder, max_new_tokens: int | None = None,
             files: Sequence[Path] | None = None) -> list[Request]:
    """`count` requests of workload `name`, ids 0..count-1, reproducible from `seed`.

    Prompts come from `files` (default: every stdlib module; `serve` passes the corpus's held-out
    modules, so the trained models are never served their own training text).
    """
    files = tuple(files) if files is not None else stdlib_files()
    if not files:
        raise EngineError("no prompt source files")
    if name not in WORKLOADS:
        raise EngineError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    workload = WORKLOADS[name]
    rng = random.Random(f"{name}/{seed}")
    requests = []
    for request_id in range(count):
        prompt_len = workload.prompt.draw(rng)
        answer_len = workload.answer.draw(rng)
        if max_new_tokens is not None:  # rescale, so a short run keeps the workload's mix of lengths
            answer_len = max(1, round(answer_len * max_new_tokens / workload.answer.hi))
        prompt = [tokenizer.bos_id] + _passage(rng, files, workload.text, prompt_len - 1, tokenizer)
        requests.append(Request(request_id, prompt, answer_len))
    return requests


def _passage(rng: random.Random, files: Sequence[Path], kind: str, n_tokens: int, tokenizer: Encoder) -> list[int]:
    """`n_tokens` tokens of text, from a random paragraph (blank-line boundary) of a random module."""
    index = rng.randrange(len(files))
    paragraphs = _text_of(files[index], kind).split("\n\n")
    start = rng.randrange(len(paragraphs))
    tokens = tokenizer.encode("\n\n".join(paragraphs[start:]))
    while len(tokens) < n_tokens:  # near the end of a module: continue into the next ones
        index = (index + 1) % len(files)
        tokens += tokenizer.encode("\n\n" + _text_of(files[index], kind))
    return tokens[:n_tokens]


@functools.cache
@functools.cache
def _text_of(path: Path, kind: str) -> str:
    source = text_of(path)
    if kind == "source":
        return source
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = (ast.get_docstring(node) for node in ast.walk(tree) if isinstance(node, documented))
    return "\n\n".join(doc for doc in docs if doc)
