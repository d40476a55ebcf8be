"""The offline corpus every machine has: the Python standard library that ships with the interpreter.

Documents are the top-level modules `<stdlib>/*.py` (the files the serving workloads draw their
prompts from), read whole as UTF-8 source: code, comments and docstrings.

The split is by file and deterministic: a module is held out when sha256 of its file name
(e.g. "ast.py"), read as an integer, is 0 mod 10 -- about a tenth of the modules, the same ones on
every machine, whatever else the standard library holds. The tokenizer, the targets and the
drafters train on the `train` files only; the acceptance benchmark's prompts come from the
`held-out` files only.

For training, the train files' tokens form one stream (modules joined by a blank line, as the
workloads join them); a training sequence is `<bos>` followed by a window of that stream starting
at a uniformly drawn token, as a workload prompt is `<bos>` followed by a passage. No `<eos>` is
trained: the corpus has no natural end of an answer, and a request ends at its token budget.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import sysconfig
from pathlib import Path

import torch

from engine.errors import EngineError

SPLITS = ("train", "held-out")
HELD_OUT_MODULUS = 10


def stdlib_files() -> tuple[Path, ...]:
    """The top-level modules of the running interpreter's standard library, in a fixed order."""
    files = tuple(sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")))
    if not files:
        raise EngineError(f"no standard-library sources under {sysconfig.get_paths()['stdlib']}")
    return files


def split_of(path: Path) -> str:
    digest = int(hashlib.sha256(path.name.encode()).hexdigest(), 16)
    return "held-out" if digest % HELD_OUT_MODULUS == 0 else "train"


def files(split: str) -> tuple[Path, ...]:
    """The split's modules, in a fixed (sorted) order."""
    if split not in SPLITS:
        raise EngineError(f"unknown corpus split {split!r}; choose one of {', '.join(SPLITS)}")
    return tuple(path for path in stdlib_files() if split_of(path) == split)


def text_of(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def describe(split: str) -> dict:
    """What a run trained on, precisely enough to rebuild it (recorded beside every artifact)."""
    chosen = files(split)
    return {
        "source": "top-level modules of the CPython standard library (<stdlib>/*.py), read whole",
        "stdlib": sysconfig.get_paths()["stdlib"], "python": platform.python_version(),
        "split": split, "rule": f"held-out iff int(sha256(file name), 16) % {HELD_OUT_MODULUS} == 0",
        "files": len(chosen), "characters": sum(len(text_of(p)) for p in chosen),
        "held_out_files": [p.name for p in files("held-out")],
    }


@functools.cache
def token_stream(tokenizer, split: str) -> torch.Tensor:
    """All of the split's tokens [n] int64 (cached per tokenizer and split)."""
    joined = "\n\n".join(text_of(path) for path in files(split))
    return torch.tensor(tokenizer.encode(joined), dtype=torch.int64)


def sample_sequences(stream: torch.Tensor, count: int, length: int, bos_id: int,
                     generator: torch.Generator) -> torch.Tensor:
    """[count, length] sequences: `<bos>` then length - 1 consecutive stream tokens from a random start."""
    starts = torch.randint(0, len(stream) - length, (count,), generator=generator)
    windows = stream[starts[:, None] + torch.arange(length - 1)]
    return torch.cat([torch.full((count, 1), bos_id, dtype=torch.int64), windows], dim=1)
