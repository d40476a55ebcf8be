"""Checks of command-line values shared by the engine's subcommands: each bad value fails the same
way in every subcommand (one EngineError line), before any model is loaded or trained."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from engine.errors import EngineError


def at_least_one(args, *names: str) -> None:
    """Counts that must be >= 1 when given (None: the subcommand's default)."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise EngineError(f"--{name.replace('_', '-')} must be at least 1 (got {value})")


def at_least_zero(args, *names: str) -> None:
    """Counts where 0 means "none" (--prefill-tokens 0: no batching) and only negatives are wrong."""
    for name in names:
        value = getattr(args, name)
        if value < 0:
            raise EngineError(f"--{name.replace('_', '-')} must be at least 0 (got {value})")


def temperature(value: float) -> None:
    from engine.sampling import MIN_TEMPERATURE, valid_temperature

    if not valid_temperature(value):
        raise EngineError(f"--temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE:g} (got {value})")


def learning_rate(value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise EngineError(f"--lr must be a finite positive number (got {value})")


def device(name: str | None) -> str:
    """The device to run on: `name`, or cuda when there is one; refuses unknown or absent devices."""
    import torch

    chosen = name or ("cuda" if torch.cuda.is_available() else "cpu")
    if chosen not in ("cpu", "cuda"):
        raise EngineError(f"unknown device {chosen!r}; choose cpu or cuda")
    if chosen == "cuda" and not torch.cuda.is_available():
        raise EngineError("--device cuda: no CUDA device is available here")
    return chosen


def cpu_threads(value: int, flag: str = "--cpu-threads") -> None:
    cores = os.cpu_count() or 1
    if not 1 <= value <= cores:
        raise EngineError(f"{flag} must be between 1 and this machine's {cores} cores (got {value})")


def output_file(path: Path | None, flag: str) -> None:
    """A file the run will write: its folder must exist and be writable, and it must not be a folder
    (checked first, so that a long run is not lost at its end)."""
    if path is None:
        return
    path = Path(path)
    folder = path.parent
    if path.is_dir() or not path.name:
        raise EngineError(f"{flag} {path}: is a folder, not a file")
    if not folder.is_dir():
        raise EngineError(f"{flag} {path}: folder {folder} does not exist")
    existed = path.exists()
    try:  # opened for appending, as the run will: the one test that permissions and mounts cannot fool
        with open(path, "a"):
            pass
    except OSError as error:
        raise EngineError(f"{flag} {path}: cannot write ({error.strerror})") from None
    if not existed:  # missing_ok: the ranks of one run probe the same files at once, one may unlink first
        path.unlink(missing_ok=True)  # (all probe before the rendezvous, so none removes a file being written)


def add_batch_invariant(parser: argparse.ArgumentParser) -> None:
    """`--batch-invariant / --no-batch-invariant` (serve, generate; ddprof capture and sweep pass it on)."""
    parser.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=True,
                        help="compute each token's row as it would be computed alone (default: on; what makes "
                             "greedy DDTree equal AR exactly); --no-batch-invariant runs the vendor's GEMMs and "
                             "norms (cuBLAS, MKL): faster, and no longer exact")


def add_cuda_graphs(parser: argparse.ArgumentParser) -> None:
    """`--cuda-graphs / --no-cuda-graphs` (serve, generate; ddprof capture and sweep pass it on)."""
    from engine.serve_defaults import CUDA_GRAPHS_HELP

    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None, help=CUDA_GRAPHS_HELP)


def cuda_graphs(on: bool | None, device: str, mode: str = "ddtree", ranks: int = 1) -> bool:
    """Whether the engine records CUDA graphs: by default (None) wherever they can run (DDTree on
    CUDA, one rank: the ranks' all-reduce inside a graph is not verified on a GPU yet); --cuda-graphs
    where they cannot run is refused in one line before any model loads."""
    if on is None:
        return device == "cuda" and mode == "ddtree" and ranks == 1
    if on:
        from engine.cuda_graphs import require_graphable

        require_graphable(device, mode)
        if ranks > 1:
            raise EngineError(f"--cuda-graphs: one rank only (got {ranks}): the ranks' all-reduce inside a graph is "
                              "not verified on a GPU")
    return on


def add_overlap(parser: argparse.ArgumentParser) -> None:
    """`--overlap / --no-overlap` (serve; ddprof capture and sweep pass it on)."""
    from engine.serve_defaults import OVERLAP_HELP

    parser.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None, help=OVERLAP_HELP)


def overlap(on: bool | None, static_step: bool, ranks: int = 1) -> bool:
    """Whether the engine overlaps its steps: by default (None) wherever the static-shape step runs
    (`static_step`: CUDA graphs on) with one rank; --overlap with several ranks (whose
    collectives in a reordered step are not verified) is refused in one line before any model loads
    (AR decoding: by Engine)."""
    if on is None:
        return static_step and ranks == 1
    if on and ranks > 1:
        raise EngineError(f"--overlap: one rank only (got {ranks}): the ranks' collectives in an overlapped step "
                          "are not verified")
    return on


def overlap_scope(on: bool, builder: str) -> str | None:
    """What an overlapped step hides, for the run's summary: the whole step with the GPU builder,
    only draft with the CPU builder (its tree_build waits for the same step's top-k on the host)."""
    if not on:
        return None
    return "whole step" if builder == "gpu" else "draft only (the CPU builder's tree_build waits for its top-k)"


def add_dtype_option(parser) -> None:
    from engine.config import DTYPES

    parser.add_argument("--dtype", choices=DTYPES, help="compute dtype (default: the checkpoint's own, config.json's "
                        "torch_dtype or dtype; the presets: float32)")


def dtype(name: str | None):
    """The torch dtype `--dtype` names, None for the weights' own."""
    import torch

    return None if name is None else getattr(torch, name)


def ranks(value: int | None, timeout_s: float) -> int:
    """The expert-parallel rank count: --ranks, else torchrun's WORLD_SIZE, else 1; the two must agree."""
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise EngineError(f"--rank-timeout must be a finite positive number of seconds (got {timeout_s})")
    launched = os.environ.get("WORLD_SIZE")
    if launched is None:
        return value or 1
    if not launched.isdigit() or int(launched) < 1:
        raise EngineError(f"WORLD_SIZE {launched!r} must be a whole number >= 1 (torchrun's variable)")
    if value is not None and value != int(launched):
        raise EngineError(f"--ranks {value} but WORLD_SIZE is {launched} (started by torchrun or --ranks): they must agree")
    return int(launched)
