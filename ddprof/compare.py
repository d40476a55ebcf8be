"""Compare two runs (e.g. CPU-heapq vs GPU tree builder): per-stage deltas with bootstrap CIs.

Runs differ in length, so stages are compared per step (mean ms per step). The confidence
intervals come from resampling each run's steps with replacement (percentile bootstrap); the
tok/s ratio's interval resamples steps too (tokens per step over step time) and is centred on
the exact wall-clock ratio.
"""

from __future__ import annotations

import numpy as np

from ddprof.analysis import GPU_SIDE_COLUMNS, stage_row
from ddprof.attribution import OTHER, OWNERS, Attribution

# Per-step metric -> (its name per step in the output, its unit in per_step's). Counts and ns alike
# are compared as means per step.
METRICS = {"cpu_ns": ("cpu_ms_per_step", 1e6), "gpu_ns": ("gpu_ms_per_step", 1e6), "crit_ns": ("crit_ms_per_step", 1e6),
           "gpu_ops": ("gpu_ops_per_step", 1), "sync_calls": ("sync_calls_per_step", 1)}
_BATCH = 64  # resamples drawn at once: bounds memory at _BATCH x steps weights
MAX_RESAMPLES = 1_000_000  # far past where a 95% interval's ends stop moving; bounds the run time


def _step_table(attribution: Attribution) -> np.ndarray:
    """Per step: the metrics per owner, then tokens and step duration (columns of one matrix)."""
    parts = [attribution.matrix(metric).astype(np.float64) for metric in METRICS]
    steps = attribution.steps
    tokens = steps["tokens"].fill_null(0).to_numpy()  # unknown counts: the tok/s ratio is then not computed
    extra = np.stack([tokens, (steps["end"] - steps["start"]).to_numpy()], axis=1)
    return np.concatenate(parts + [extra.astype(np.float64)], axis=1)


def _resampled_sums(table: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Column sums of `resamples` bootstrap resamples of the rows: shape (resamples, columns)."""
    n = table.shape[0]
    out = []
    for first in range(0, resamples, _BATCH):
        batch = min(_BATCH, resamples - first)
        picks = rng.integers(0, n, size=(batch, n)) + (np.arange(batch) * n)[:, None]
        weights = np.bincount(picks.ravel(), minlength=batch * n).reshape(batch, n).astype(np.float64)
        out.append(weights @ table)
    return np.concatenate(out)


def compare(a: Attribution, b: Attribution, summary_a: dict, summary_b: dict, *, resamples: int = 2000,
            confidence: float = 0.95, seed: int = 0) -> dict:
    """The `ddprof compare --json` object: headline numbers of both runs and per-stage deltas."""
    rng = np.random.default_rng(seed)
    table_a, table_b = _step_table(a), _step_table(b)
    n_a, n_b = table_a.shape[0], table_b.shape[0]
    boot_a = _resampled_sums(table_a, resamples, rng) / n_a
    boot_b = _resampled_sums(table_b, resamples, rng) / n_b
    mean_a, mean_b = table_a.mean(axis=0), table_b.mean(axis=0)
    tail = (1 - confidence) / 2 * 100

    def interval(samples: np.ndarray) -> list[float]:
        return [float(v) for v in np.percentile(samples, [tail, 100 - tail])]

    n_owners = len(OWNERS)
    stages = []
    for code, owner in enumerate(OWNERS):
        row = {"stage": owner}
        for m, (metric, (name, unit)) in enumerate(METRICS.items()):
            if metric in GPU_SIDE_COLUMNS and not (a.has_gpu_activity and b.has_gpu_activity):  # unknown in one
                row.update({f"a_{name}": None, f"b_{name}": None, f"{name}_delta": None, f"{name}_delta_ci": None})
                continue
            col = m * n_owners + code
            row[f"a_{name}"] = mean_a[col] / unit
            row[f"b_{name}"] = mean_b[col] / unit
            row[f"{name}_delta"] = (mean_b[col] - mean_a[col]) / unit
            row[f"{name}_delta_ci"] = interval((boot_b[:, col] - boot_a[:, col]) / unit)
        share_a, share_b = _crit_share(summary_a, owner), _crit_share(summary_b, owner)
        row.update(a_crit_share=share_a, b_crit_share=share_b, crit_share_delta=share_b - share_a)
        stages.append(row)

    ratio = None
    ratio_ci = None
    if summary_a["tok_per_s"] and summary_b["tok_per_s"] is not None:
        ratio = summary_b["tok_per_s"] / summary_a["tok_per_s"]
        tokens, duration = table_a.shape[1] - 2, table_a.shape[1] - 1
        rate_a = boot_a[:, tokens] / boot_a[:, duration]
        rate_b = boot_b[:, tokens] / boot_b[:, duration]
        point = (mean_b[tokens] / mean_b[duration]) / (mean_a[tokens] / mean_a[duration])
        if np.isfinite(point) and point > 0:
            ratio_ci = interval(ratio * (rate_b / rate_a) / point)

    headline = ("source", "steps", "tokens", "wall_s", "tok_per_s", "bound_by", "other_crit_ms")
    return {
        "a": {k: summary_a[k] for k in headline},
        "b": {k: summary_b[k] for k in headline},
        "tok_per_s_ratio": ratio,
        "tok_per_s_ratio_ci": ratio_ci,
        "bound_by_changed": summary_a["bound_by"] != summary_b["bound_by"],
        "confidence": confidence,
        "resamples": resamples,
        "seed": seed,
        "stages": stages,
    }


def _crit_share(summary: dict, owner: str) -> float:
    if owner == OTHER:
        return summary["other_crit_share"]
    return stage_row(summary, owner)["crit_share"]
