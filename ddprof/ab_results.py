"""A/B result files (benchmarks/serving_ab.py: builder_ab_*.json, moe_dispatch_ab_*.json,
batch_invariant_ab_*.json, cuda_graphs_ab_*.json, overlap_ab_*.json, prefill_ab_*.json) as evidence.

A single capture of each builder cannot say whether a 1.2x tok/s gap is the builder or the host:
single runs on the H200 host vary by up to 1.5x. A paired A/B can: each round runs both variants
in the same minute, and the verdict is the median of the rounds' B/A ratios. This reads such a
file, recomputes the ratios from its rows, and adds a bootstrap interval for their median (the
file records only the median and the range). Newer files also time the decode steps alone
(`decode_tok_per_s`: prefill excluded), where a step-level change shows undiluted; those ratios
are read beside the serving ones.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ddprof.errors import DdprofError
from ddprof.execution import check_cuda_graphs, execution_of

BENCHMARKS = {"builder_ab": "builder", "moe_dispatch_ab": "dispatch",  # benchmark -> the field naming a row's variant
              "batch_invariant_ab": "numerics", "cuda_graphs_ab": "execution", "overlap_ab": "scheduling",
              "prefill_ab": "prefill"}
VARIANT_NAMES = {"cpu": "CPU heapq", "gpu": "GPU builder", "graphs": "CUDA graphs"}
# The settings a capture pair must share with an A/B for the A/B to speak for it (and its execution).
MATCHED_SETTINGS = ("model", "workload", "concurrency", "budget")
DECODE_RATE = "decode_tok_per_s"
CONFIDENCE = 0.95
RESAMPLES = 10_000


@dataclass(frozen=True)
class PairedRatios:
    """Per round, one rate of variant b over the same rate of variant a, in round order."""

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


@dataclass(frozen=True)
class ABResult:
    """One paired A/B: per round, tok/s of variant b over variant a, serving (wall) and, where the
    file has them, decode steps alone."""

    source: Path
    benchmark: str
    a: str
    b: str
    settings: dict
    serving: PairedRatios
    decode: PairedRatios | None  # None: a file from before decode steps were timed apart

    @property
    def compares_builders(self) -> bool:
        return self.benchmark == "builder_ab"

    @property
    def on_gpu(self) -> bool:
        return self.settings.get("device") == "cuda"

    @property
    def execution(self) -> str | None:
        """How both variants ran their steps (ddprof.execution); None for a cuda_graphs_ab, which compares the two."""
        return None if self.benchmark == "cuda_graphs_ab" else execution_of(self.settings)

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
    check_cuda_graphs(settings, f"{path}: settings")
    timed_decode = [isinstance(row, dict) and DECODE_RATE in row for row in rows]
    if any(timed_decode) and not all(timed_decode):
        raise DdprofError(f"{path}: run {timed_decode.index(False)} lacks `{DECODE_RATE}` that other runs have "
                          "(every run times its decode steps, or none does)")
    rate_keys = ("tok_per_s", DECODE_RATE) if all(timed_decode) else ("tok_per_s",)
    by_round: dict[int, dict[str, tuple[float, ...]]] = {}
    for row in rows:
        rates = [row.get(key) for key in rate_keys] if isinstance(row, dict) else [None]
        if (not all(_positive(rate) for rate in rates)
                or not isinstance(row.get("round"), int) or not isinstance(row.get(field), str)):
            raise DdprofError(f"{path}: every run needs `round` (a whole number), `{field}` (a string) and "
                              f"{' and '.join(f'`{key}`' for key in rate_keys)} (a positive number); found {row!r}")
        by_round.setdefault(row["round"], {})[row[field]] = tuple(float(rate) for rate in rates)
    variants = sorted({name for rates in by_round.values() for name in rates})
    verdicts = [(b, a) for b in variants for a in variants if b != a and f"paired_{b}_over_{a}" in data]
    if len(variants) != 2 or len(verdicts) != 1:
        raise DdprofError(f"{path}: an A/B compares two {field}s named by its `paired_B_over_A` verdict; "
                          f"found {field}s {', '.join(variants) or 'none'} and "
                          f"{len(verdicts)} such verdict{'' if len(verdicts) == 1 else 's'}")
    (b, a), = verdicts
    incomplete = [round_ for round_, rates in by_round.items() if len(rates) != 2]
    if incomplete:
        raise DdprofError(f"{path}: round {incomplete[0]} lacks one of the two {field}s (rounds are paired)")
    paired = [PairedRatios(tuple(by_round[round_][b][i] / by_round[round_][a][i] for round_ in sorted(by_round)))
              for i in range(len(rate_keys))]
    return ABResult(path, data["benchmark"], a, b, settings, paired[0], paired[1] if len(paired) > 1 else None)


def _positive(rate) -> bool:
    return isinstance(rate, int | float) and not isinstance(rate, bool) and math.isfinite(rate) and rate > 0
