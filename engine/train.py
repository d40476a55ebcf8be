"""What the two trainers (engine/train_target.py, engine/train_drafter.py) share: the common
command-line options, one CPU thread by default, the learning-rate schedule, a rich progress bar
showing the loss, and the JSON record written beside every checkpoint.

One thread is the default because the CPU machines this runs on are shared: with other busy
processes, two PyTorch threads spin-wait on each other and train several times slower than one.
"""

from __future__ import annotations

import json
import math
import os
import platform
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from engine import arguments
from engine.config import PRESETS
from engine.errors import EngineError
from engine.trained import asset_dir

TRAINABLE = ("tiny", "small")


def add_common_arguments(parser, *, steps: dict[str, int], lr: float) -> None:
    parser.add_argument("--model", default="small", choices=TRAINABLE, help="preset to train (default small)")
    parser.add_argument("--steps", type=int, help="optimizer steps (default: " +
                        ", ".join(f"{k} {v}" for k, v in steps.items()) + ")")
    parser.add_argument("--lr", type=float, default=lr, help=f"peak learning rate (default {lr})")
    parser.add_argument("--seed", type=int, default=0, help="seeds initialisation and data order (default 0)")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch CPU threads (default 1; see engine/train.py)")
    parser.add_argument("--out", type=Path, help="the pair's folder: target/ and drafter.safetensors with their "
                        "records (default: the committed engine/assets/<preset>); train-drafter reads target/ there")


def check_common_arguments(args) -> None:
    if args.model not in PRESETS or args.model not in TRAINABLE:
        raise EngineError(f"--model {args.model!r}: only {', '.join(TRAINABLE)} are trained here")
    arguments.at_least_one(args, "steps", "threads")
    arguments.cpu_threads(args.threads, flag="--threads")
    arguments.learning_rate(args.lr)
    # Checked now, by writing a file there: a folder that cannot take the results must not cost a run.
    out = Path(args.out) if args.out is not None else asset_dir(args.model)
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as error:
        raise EngineError(f"--out {out}: cannot write there ({error.strerror})") from None
    torch.set_num_threads(args.threads)


def learning_rate(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak`, then cosine decay to a tenth of it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


@contextmanager
def progress_bar(description: str, total: int):
    """A rich progress bar; `update(advance, info)` moves it and shows `info` (e.g. the loss). Into a
    log file (no terminal) it prints a line every twentieth of the way instead."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    console = Console()
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn(), TimeRemainingColumn()]
    started, done, every = time.perf_counter(), 0, max(1, total // 20)
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(description, total=total, info="")

        def update(advance: int = 1, info: str = "") -> None:
            nonlocal done
            progress.update(task, advance=advance, info=info)
            done += advance
            if not console.is_terminal and (done // every != (done - advance) // every or done == total):
                print(f"{description}: {done}/{total} {info} {time.perf_counter() - started:.0f} s", flush=True)

        yield update


def run_record(args, *, started: float, **fields) -> dict:
    """The JSON written beside a checkpoint: exactly how it was made and how it ended."""
    return {"command": args.command_line, "seed": args.seed, "threads": args.threads,
            "wall_s": round(time.perf_counter() - started, 1),
            "machine": f"{platform.machine()} ({os.cpu_count()} cores, shared)", "python": platform.python_version(),
            "torch": torch.__version__, **fields}


def write_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
