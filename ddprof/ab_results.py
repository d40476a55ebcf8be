"""A/B result files (benchmarks/serving_ab.py: builder_ab_*.json, moe_dispatch_ab_*.json,
batch_invariant_ab_*.json, cuda_graphs_ab_*.json, overlap_ab_*.json) as evidence.

A single capture of each builder cannot say whether a 1.2x tok/s gap is the builder or the host:
single runs on the H200 host vary by up to 1.5x. A paired A/B can: each round runs both variants
in the same minute, and the verdict is the median of the rounds' B/A ratios. This reads such a
file, recomputes the ratios from its rows, and adds a bootstrap interval for their median (the
file records only the median and the range).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ddprof.errors import DdprofError

BENCHMARKS = {"builder_ab": "builder", "moe_dispatch_ab": "dispatch",  # benchmark -> the field naming a row's variant
              "batch_invariant_ab": "numerics", "cuda_graphs_ab": "execution", "overlap_ab": "scheduling"}
VARIANT_NAMES = {"cpu": "CPU heapq", "gpu": "GPU builder"}
# The settings a capture pair must share with an A/B for the A/B to speak for it.
MATCHED_SETTINGS = ("model", "workload", "concurrency", "budget")
CONFIDENCE = 0.95
RESAMPLES = 10_000


@dataclass(frozen=True)
class ABResult:
    """One paired A/B: per round, tok/s of variant b over variant a."""

    source: Path
    benchmark: str
    a: str
    b: str
    settings: dict
    ratios: tuple[float, ...]

    @property
    def rounds(self) -> int:
        return len(self.ratios)

    @property
    def median(self) -> float:
        return float(np.median(self.ratios))

    @property
    def ci(self) -> tuple[float, float]:
        """Percentile-bootstrap interval (CONFIDENCE) of the median ratio, resampling rounds; seeded, so
        the page says the same thing every time it is made."""
        rng = np.random.default_rng(0)
        ratios = np.asarray(self.ratios)
        medians = np.median(ratios[rng.integers(0, ratios.size, size=(RESAMPLES, ratios.size))], axis=1)
        tail = (1 - CONFIDENCE) / 2 * 100
        low, high = np.percentile(medians, [tail, 100 - tail])
        return float(low), float(high)

    @property
    def compares_builders(self) -> bool:
        return self.benchmark == "builder_ab"

    @property
    def on_gpu(self) -> bool:
        return self.settings.get("device") == "cuda"

    def names(self) -> tuple[str, str]:
        """The variants as people call them: ("CPU heapq", "GPU builder"), ("per-expert", "sorted")."""
        return VARIANT_NAMES.get(self.a, self.a), VARIANT_NAMES.get(self.b, self.b)


def split_inputs(paths: Sequence[Path]) -> tuple[list[Path], list[ABResult]]:
    """A dashboard's inputs as (traces, A/B results): a `.json` is an A/B result file (a trace is a
    .sqlite or .nsys-rep; its capture's NAME.json is found beside it)."""
    paths = [Path(path) for path in paths]
    traces = [path for path in paths if path.suffix != ".json"]
    if not traces:
        raise DdprofError("no traces given: pass one or more .sqlite exports or .nsys-rep reports (A/B result "
                          "files are evidence beside them, not runs to draw)")
    return traces, [read_ab(path) for path in paths if path.suffix == ".json"]


def read_ab(path: Path) -> ABResult:
    """The A/B of `path`, or one line naming the file and what is wrong with it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DdprofError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise DdprofError(f"{path}: unreadable A/B result ({exc})") from None
    if not isinstance(data, dict) or data.get("benchmark") not in BENCHMARKS:
        raise DdprofError(f"{path}: not an A/B result file (its `benchmark` must be one of {', '.join(BENCHMARKS)}; "
                          "a capture's NAME.json is read from beside its trace: pass the .sqlite)")
    field = BENCHMARKS[data["benchmark"]]
    rows, settings = data.get("runs"), data.get("settings")
    if not isinstance(rows, list) or not rows or not isinstance(settings, dict):
        raise DdprofError(f"{path}: an A/B result needs `settings` (an object) and `runs` (a non-empty list)")
    by_round: dict[int, dict[str, float]] = {}
    for row in rows:
        rate = row.get("tok_per_s") if isinstance(row, dict) else None
        if (not isinstance(rate, int | float) or isinstance(rate, bool) or not math.isfinite(rate) or rate <= 0
                or not isinstance(row.get("round"), int) or not isinstance(row.get(field), str)):
            raise DdprofError(f"{path}: every run needs `round` (a whole number), `{field}` (a string) and "
                              f"`tok_per_s` (a positive number); found {row!r}")
        by_round.setdefault(row["round"], {})[row[field]] = float(rate)
    variants = sorted({name for rates in by_round.values() for name in rates})
    paired = [key for key in data if key.startswith("paired_") and "_over_" in key]
    b, _, a = paired[0].removeprefix("paired_").partition("_over_") if paired else ("", "", "")
    if len(variants) != 2 or {a, b} != set(variants):
        raise DdprofError(f"{path}: an A/B compares two {field}s named by its `paired_B_over_A` verdict; "
                          f"found {', '.join(variants) or 'none'}")
    incomplete = [round_ for round_, rates in by_round.items() if len(rates) != 2]
    if incomplete:
        raise DdprofError(f"{path}: round {incomplete[0]} lacks one of the two {field}s (rounds are paired)")
    ratios = tuple(by_round[round_][b] / by_round[round_][a] for round_ in sorted(by_round))
    return ABResult(path, data["benchmark"], a, b, settings, ratios)
