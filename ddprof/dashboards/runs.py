"""The runs a dashboard shows: each trace's breakdown, plus what its capture recorded about it.

`ddprof capture` writes NAME.json beside NAME.sqlite / NAME.nsys-rep (builder, budget,
concurrency, model, workload, ...). A trace without one is still shown, labelled by its file
name, and the page says which settings are unknown.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from ddprof.attribution import Attribution
from ddprof.errors import DdprofError
from ddprof.execution import check_cuda_graphs, execution_of
from ddprof.ranks import Ranked, analyse_rank, processes, side_by_side
from ddprof.stage_map import StageMap
from ddprof.wall import prefills

BUILDER_NAMES = {"cpu": "CPU heapq", "gpu": "GPU builder"}
UNKNOWN = "unknown"
# What a capture was asked to do (not what it measured); runs that agree on all but the builder are a pair.
# `execution` is read from `cuda_graphs` (ddprof.execution): a graphed run pairs with a graphed run only.
SETTINGS = ("model", "workload", "concurrency", "budget", "requests", "max_new_tokens", "seed", "execution")
# The capture metadata the page reads, by the type it must have (null is allowed: unknown).
_NUMBER_KEYS = ("concurrency", "budget", "requests", "max_new_tokens", "seed", "steps", "generated_tokens",
                "wall_s", "tok_per_s")
_TEXT_KEYS = ("model", "workload", "builder", "device")
_BUILDER_ORDER = {name: i for i, name in enumerate(BUILDER_NAMES.values())}
_SHORT = {"concurrency": "c", "max_new_tokens": "max_new"}


@dataclass(frozen=True)
class Run:
    """One trace: its breakdown (ddprof.analysis), attribution, capture metadata (None: no NAME.json) and label."""

    source: Path
    meta: dict | None
    attribution: Attribution
    summary: dict
    prefills: pl.DataFrame  # the engine's prefill ranges (pid, tid, start, end): where time between steps goes
    label: str = ""
    rank: int | None = None  # which rank of a report holding several (ddprof.ranks); None: the only process
    ranked: Ranked | None = None  # that report's ranks side by side (shared by its runs)

    def setting(self, key: str):
        if not self.meta:
            return None
        return execution_of(self.meta) if key == "execution" else self.meta.get(key)

    @property
    def builder(self) -> str:
        """CPU heapq, GPU builder, another builder's own name, or unknown."""
        raw = self.setting("builder")
        return BUILDER_NAMES.get(raw, raw) if raw else UNKNOWN

    @property
    def settings(self) -> tuple:
        """Everything but the builder: runs with equal settings compare the builders and nothing else."""
        return tuple(self.setting(key) for key in SETTINGS)

    @property
    def sort_key(self) -> tuple:
        """Orders runs by settings (numbers as numbers, unknown last), then CPU heapq before GPU builder."""
        settings = tuple((value is None, value if isinstance(value, int | float) else 0, str(value))
                         for value in self.settings)
        return self.meta is None, settings, _BUILDER_ORDER.get(self.builder, len(_BUILDER_ORDER)), self.builder

    @property
    def interpreted_gpu_builder(self) -> bool:
        return interpreted_gpu_builder(self.meta)


INTERPRETED_NOTE = ("captured on a CPU, so the GPU builder's Triton kernel ran in Triton's interpreter "
                    "(TRITON_INTERPRET=1); its tree_build times are interpreter times, far slower than the kernel "
                    "on a GPU")


def interpreted_gpu_builder(meta: dict | None) -> bool:
    """A GPU-builder run captured on a CPU (by its capture metadata): its Triton kernel ran in the
    interpreter, not on a GPU."""
    return bool(meta) and meta.get("builder") == "gpu" and str(meta.get("device") or "").startswith("cpu")


def metadata_path(trace: Path) -> Path:
    return Path(trace).with_suffix(".json")


def read_metadata(trace: Path) -> dict | None:
    """The capture's NAME.json beside `trace`, or None when there is none."""
    path = metadata_path(trace)
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise DdprofError(f"{path}: unreadable capture metadata ({exc})") from None
    if not isinstance(meta, dict):
        raise DdprofError(f"{path}: capture metadata must be a JSON object, not {type(meta).__name__}")
    for keys, kinds, what in ((_NUMBER_KEYS, (int, float), "a number"), (_TEXT_KEYS, (str,), "a string")):
        for key in keys:
            value = meta.get(key)
            if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)
                                      or isinstance(value, float) and not math.isfinite(value)):  # JSON has no NaN
                raise DdprofError(f"{path}: capture metadata `{key}` must be {what} or null, not {value!r}")
    check_cuda_graphs(meta, f"{path}: capture metadata")
    return meta


def load_runs(paths: Sequence[Path], stage_map: StageMap | None = None, *, drop_incomplete: bool = False,
              advance: Callable[[str], None] = lambda label: None) -> list[Run]:
    """Load, attribute and break down every trace (ddprof.pipeline.analyse), then label the runs.

    Runs come back ordered by their settings, CPU heapq before GPU builder, so every figure and
    table on the page lists them the same way."""
    if not paths:
        raise DdprofError("no traces given: pass one or more .sqlite exports or .nsys-rep reports")
    given = Counter(Path(path).resolve() for path in paths)
    twice = next((path for path in paths if given[Path(path).resolve()] > 1), None)
    if twice is not None:
        raise DdprofError(f"{twice}: given more than once (each trace is one run on the page)")
    runs = []
    for path in map(Path, paths):
        # A report of several ranks, or a quoted glob of per-rank reports: one run per rank.
        found = processes([path], stage_map, advance)
        analysed = [analyse_rank(process, stage_map, drop_incomplete=drop_incomplete, advance=advance)
                    for process in found]
        ranked = side_by_side([rank_run for _, rank_run in analysed], stage_map) if len(found) > 1 else None
        for trace, rank_run in analysed:
            source = path if path.exists() else rank_run.process.source  # a glob: each rank's own report
            runs.append(Run(source, read_metadata(source), rank_run.attribution, rank_run.summary,
                            prefills(trace, stage_map), rank=rank_run.process.rank if ranked else None,
                            ranked=ranked))
    return sorted(labelled(runs), key=lambda run: run.sort_key)


def labelled(runs: Sequence[Run]) -> list[Run]:
    """Give each run a short unique label: its builder and the settings that vary across the runs."""
    varying = varying_settings(runs)
    labels = []
    for run in runs:
        if run.meta is None:
            labels.append(run.source.stem)
            continue
        parts = [str(run.setting(key)) if key == "execution" else f"{_SHORT.get(key, key)}={run.setting(key)}"
                 for key in varying]
        labels.append(" · ".join([run.builder, *parts]))
    labels = [label if run.rank is None else f"{label} · rank {run.rank}" for run, label in zip(runs, labels)]
    # Where labels repeat, the file's name tells the runs apart; where even that repeats (same-named
    # files in different folders), its folder does.
    for tell_apart in (lambda run: run.source.stem, lambda run: str(run.source.parent)):
        repeated = Counter(labels)
        labels = [f"{label} ({tell_apart(run)})" if repeated[label] > 1 and label != tell_apart(run) else label
                  for run, label in zip(runs, labels)]
    return [replace(run, label=label) for run, label in zip(runs, labels)]


def varying_settings(runs: Sequence[Run], leave_out: Sequence[str] = ()) -> list[str]:
    """The settings that differ between runs with metadata (those without say nothing)."""
    known = [run for run in runs if run.meta is not None]
    return [key for key in SETTINGS if key not in leave_out and len({run.setting(key) for run in known}) > 1]


def dropped_note(dropped: dict[str, int]) -> str | None:
    """What --drop-incomplete left out (ddprof.attribution's `dropped`), None when nothing."""
    if not any(dropped.values()):
        return None
    return (f"left out {dropped['unclosed']} unclosed and {dropped['cross_thread']} cross-thread step/stage ranges "
            f"and {dropped['outside_step']} stage ranges across a step's start or end (--drop-incomplete)")


def notes(runs: Sequence[Run]) -> list[str]:
    """What a reader must know to trust the page: unknown settings, interpreted kernels, dropped ranges."""
    found = []
    for run in runs:
        if run.meta is None:
            found.append(f"{run.label}: no {metadata_path(run.source).name} beside the trace; builder, "
                         "concurrency, budget, model and workload are unknown (labelled by file name)")
        elif run.meta.get("trace_steps") not in (None, run.summary["steps"] * (run.setting("ranks") or 1)):
            found.append(f"{run.label}: its metadata counts {run.meta['trace_steps']} steps but the trace holds "
                         f"{run.summary['steps']}; the JSON may belong to another capture")
        left_out = dropped_note(run.summary["dropped_ranges"])
        if left_out:
            found.append(f"{run.label}: {left_out}")
    interpreted = [run.label for run in runs if run.interpreted_gpu_builder]
    if interpreted:
        found.append(f"{', '.join(interpreted)}: {INTERPRETED_NOTE}")
    if not any(run.attribution.has_gpu_activity for run in runs):
        found.append("no CUDA activity in any trace (CPU captures): gpu_ms is n/a and the timeline's GPU lane "
                     "is empty")
    return found
