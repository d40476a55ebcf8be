"""Compare two runs (e.g. CPU-heapq vs GPU tree builder): per-stage deltas with bootstrap CIs.

Runs differ in length, so stages are compared per step (mean ms per step). The confidence
intervals come from resampling each run's steps with replacement (percentile bootstrap); the
tok/s ratio's interval resamples steps too (tokens per step over step time) and is centred on
the exact wall-clock ratio. The --fail-if rules (ddprof.gate) are judged on the same resamples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ddprof.analysis import GPU_SIDE_COLUMNS, stage_row
from ddprof.attribution import OTHER, OWNERS, PER_STEP_COLUMNS, Attribution
from ddprof.errors import DdprofError
from ddprof.gate import MEASURES, STEP_TIME, TOK_PER_S, Rule, verdict
from engine.stages import STAGES

# Per-step metric -> (its name per step in the output, its unit in per_step's). Counts and ns alike
# are compared as means per step.
METRICS = {"cpu_ns": ("cpu_ms_per_step", 1e6), "gpu_ns": ("gpu_ms_per_step", 1e6), "crit_ns": ("crit_ms_per_step", 1e6),
           "gpu_ops": ("gpu_ops_per_step", 1), "sync_calls": ("sync_calls_per_step", 1)}
_BATCH = 64  # resamples drawn at once: bounds memory at _BATCH x steps weights
MAX_RESAMPLES = 1_000_000  # far past where a 95% interval's ends stop moving; bounds the run time


def _column(metric: str, owner: str) -> int:
    """Where `_step_table` keeps a per-step column of an owner."""
    return PER_STEP_COLUMNS.index(metric) * len(OWNERS) + OWNERS.index(owner)


_TOKENS = len(PER_STEP_COLUMNS) * len(OWNERS)  # `_step_table`'s last two columns: tokens, step duration
_STEP_TIME = _TOKENS + 1


def _step_table(attribution: Attribution) -> np.ndarray:
    """Per step: every per-step column per owner, then tokens and step duration (one matrix)."""
    parts = [attribution.matrix(metric).astype(np.float64) for metric in PER_STEP_COLUMNS]
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
            confidence: float = 0.95, seed: int = 0, fail_if: Sequence[Rule] = ()) -> dict:
    """The `ddprof compare --json` object: headline numbers of both runs, per-stage deltas, and
    the verdict of each --fail-if rule."""
    rng = np.random.default_rng(seed)
    table_a, table_b = _step_table(a), _step_table(b)
    n_a, n_b = table_a.shape[0], table_b.shape[0]
    boot_a = _resampled_sums(table_a, resamples, rng) / n_a
    boot_b = _resampled_sums(table_b, resamples, rng) / n_b
    mean_a, mean_b = table_a.mean(axis=0), table_b.mean(axis=0)
    tail = (1 - confidence) / 2 * 100

    def interval(samples: np.ndarray) -> list[float]:
        return [float(v) for v in np.percentile(samples, [tail, 100 - tail])]

    stages = []
    for owner in OWNERS:
        row = {"stage": owner}
        for metric, (name, unit) in METRICS.items():
            if metric in GPU_SIDE_COLUMNS and not (a.has_gpu_activity and b.has_gpu_activity):  # unknown in one
                row.update({f"a_{name}": None, f"b_{name}": None, f"{name}_delta": None, f"{name}_delta_ci": None})
                continue
            col = _column(metric, owner)
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
        rate_a = boot_a[:, _TOKENS] / boot_a[:, _STEP_TIME]
        rate_b = boot_b[:, _TOKENS] / boot_b[:, _STEP_TIME]
        point = (mean_b[_TOKENS] / mean_b[_STEP_TIME]) / (mean_a[_TOKENS] / mean_a[_STEP_TIME])
        if np.isfinite(point) and point > 0:
            ratio_ci = interval(ratio * (rate_b / rate_a) / point)

    verdicts = []
    for rule in fail_if:
        require_known(rule, summary_a, "A")
        require_known(rule, summary_b, "B")
        if rule.field == TOK_PER_S:
            if ratio_ci is None:
                raise DdprofError(f"--fail-if {rule.text!r}: the tok/s of {summary_a['source']} has no interval "
                                  "(no tokens or no step time)")
            verdicts.append(verdict(rule, summary_a[TOK_PER_S], summary_b[TOK_PER_S], (ratio - 1) * 100,
                                    [(end - 1) * 100 for end in ratio_ci]))
        else:
            verdicts.append(_field_verdict(rule, mean_a, mean_b, boot_a, boot_b, interval, summary_a["source"]))

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
        "verdicts": verdicts,
        "regressions": sum(v["regression"] for v in verdicts),
    }


def require_known(rule: Rule, summary: dict, run: str) -> None:
    """Refuse a rule on a field that the run's breakdown leaves unknown (null), before judging it."""
    if rule.field == TOK_PER_S:
        value, why = summary[TOK_PER_S], "the trace has no token marks"
    else:
        owner = MEASURES[rule.field].owner
        value = stage_row(summary, owner)[rule.field.partition(".")[2]] if owner in STAGES else 0
        why = "the trace has no GPU activity"
    if value is None:
        raise DdprofError(f"--fail-if {rule.text!r}: {rule.field} is unknown in run {run} ({summary['source']}): "
                          f"{why}")


def _field_verdict(rule: Rule, mean_a: np.ndarray, mean_b: np.ndarray, boot_a: np.ndarray, boot_b: np.ndarray,
                   interval, source_a: str) -> dict:
    """A per-step field's change from A to B in %, and its interval over the resamples."""
    measure = MEASURES[rule.field]
    weights = np.zeros(mean_a.size)
    for metric, sign in measure.terms:
        weights[_STEP_TIME if metric == STEP_TIME else _column(metric, measure.owner or OTHER)] += sign

    def value(table: np.ndarray) -> np.ndarray:
        total = table @ weights
        return total / table[..., _STEP_TIME] if measure.share else total

    point_a, point_b = value(mean_a), value(mean_b)
    if point_a == 0 and point_b != 0:
        raise DdprofError(f"--fail-if {rule.text!r}: {rule.field} is 0 per step in run A ({source_a}), so a change "
                          "in % is undefined")
    with np.errstate(divide="ignore", invalid="ignore"):
        change = np.nan_to_num(value(boot_b) / value(boot_a) - 1, nan=0.0, posinf=np.inf)  # 0 -> 0: no change
    change_pct = (point_b / point_a - 1) * 100 if point_a else 0.0
    return verdict(rule, point_a / measure.unit, point_b / measure.unit, change_pct,
                   [end * 100 for end in interval(change)])


def _crit_share(summary: dict, owner: str) -> float:
    if owner == OTHER:
        return summary["other_crit_share"]
    return stage_row(summary, owner)["crit_share"]
