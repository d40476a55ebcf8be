"""The sentences on top of the page: the answer to "does the GPU tree builder move tok/s, and what
bounds the step?" with the evidence the page has, and no more.

Per builder pair (runs that differ only in the builder), the measured tok/s ratio, and what kind of
evidence it is: a paired A/B (an A/B result file of the same settings and execution, CUDA graphs or
eager: the median ratio of its rounds and a 95% interval, for serving and, where the file timed
them, for the decode steps alone) or one capture of each, which is labelled as such (a single
pair's gap can be host noise). Then A/B files that match no pair, the projection (a CPU-heapq run with the GPU
builder's tree_build cost), and the stage that bounds the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ddprof.ab_results import MATCHED_SETTINGS, VARIANT_NAMES, ABResult, PairedRatios
from ddprof.analysis import stage_row
from ddprof.dashboards.pairs import CPU, GPU, STAGE, builder_pairs, projection
from ddprof.dashboards.runs import Run, varying_settings
from ddprof.projection import crit_ms_per_step


def bound_share(run: Run) -> float:
    """The crit_share of the stage that bounds the run (its `bound_by`)."""
    return stage_row(run.summary, run.summary["bound_by"])["crit_share"]


def _share(value: float) -> str:
    return f"{value * 100:.0f}%"


def _listed(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _where(setting: Callable[[str], object], extra: Sequence[str] = ()) -> str:
    """E.g. "small c=8", plus any other setting that tells pairs apart ("budget=32", "eager")."""
    parts = [str(setting("model")), f"c={setting('concurrency')}"]
    return " ".join(parts + [str(setting(key)) if key == "execution" else f"{key}={setting(key)}"
                             for key in extra if key not in ("model", "concurrency")])


def _ab_where(ab: ABResult) -> str:
    """E.g. "small c=64 (GPU builder, CUDA graphs)": an A/B that matches no pair says how it ran, with
    which builder where it held the builder fixed (a cuda_graphs_ab ran both ways: no execution)."""
    builder = ab.settings.get("builder") if not ab.compares_builders else None
    how = [VARIANT_NAMES.get(builder, builder)] if isinstance(builder, str) else []
    how += [ab.execution] if ab.execution else []
    return f"{_where(ab.settings.get)} ({', '.join(how)})" if how else _where(ab.settings.get)


def _topic(ab: ABResult) -> str:
    """What a non-builder A/B varies, by its benchmark's name ("moe dispatch"); a cuda_graphs_ab's is its execution."""
    return "execution" if ab.benchmark == "cuda_graphs_ab" else ab.benchmark.removesuffix("_ab").replace("_", " ")


def _interval(paired: PairedRatios) -> str:
    low, high = paired.ci
    return f"95% CI {low:.2f}-{high:.2f}"


def _paired(ab: ABResult) -> str:
    """E.g. "1.01x, paired A/B of 8 rounds, 95% CI 1.00-1.03 (FILE)", or where the file timed decode
    steps apart "serving 1.01x (paired A/B of 8 rounds, 95% CI 1.00-1.03), decode steps 1.20x (95% CI
    1.19-1.22) (FILE)"."""
    serving, rounds = ab.serving, f"paired A/B of {ab.serving.rounds} rounds"
    if ab.decode is None:
        return f"{serving.median:.2f}x, {rounds}, {_interval(serving)} ({ab.source.name})"
    return (f"serving {serving.median:.2f}x ({rounds}, {_interval(serving)}), decode steps {ab.decode.median:.2f}x "
            f"({_interval(ab.decode)}) ({ab.source.name})")


def matching_ab(run: Run, evidence: Sequence[ABResult]) -> ABResult | None:
    """The builder A/B run with the pair's model, workload, concurrency and budget, on the same kind
    of device (GPU or CPU) and the same way (CUDA graphs or eager)."""
    device = run.setting("device")
    if device is None:
        return None
    on_gpu = not str(device).startswith("cpu")
    return next((ab for ab in evidence if ab.compares_builders and ab.on_gpu == on_gpu
                 and ab.execution == run.setting("execution")
                 and all(ab.settings.get(key) == run.setting(key) for key in MATCHED_SETTINGS)), None)


def _measured_ratio(run: Run, donor: Run) -> float | None:
    cpu, gpu = run.summary["tok_per_s"], donor.summary["tok_per_s"]
    return gpu / cpu if cpu and gpu is not None else None


def _builder_clauses(runs: Sequence[Run], evidence: Sequence[ABResult]) -> tuple[list[str], set[int]]:
    """One clause per builder pair, and the ids of the A/B results they used."""
    extra = varying_settings(runs)
    clauses, used = [], set()
    for run, donor in builder_pairs(runs, runs):
        where, ratio = _where(run.setting, extra), _measured_ratio(run, donor)
        single = "unknown (no tok/s)" if ratio is None else f"{ratio:.2f}x"
        ab = matching_ab(run, evidence)
        if donor.interpreted_gpu_builder:
            clauses.append(f"{where}: {single} from one capture of each, with the {GPU} in Triton's interpreter "
                           "(a CPU capture: says nothing about a GPU)")
        elif ab is not None:
            used.add(id(ab))
            clauses.append(f"{where}: {_paired(ab)}; this page's single captures: {single}")
        else:
            clauses.append(f"{where}: {single} from single captures, one of each (no interval: not a measured "
                           "difference)")
    return clauses, used


def _projection_clauses(runs: Sequence[Run]) -> list[str]:
    extra = varying_settings(runs)
    clauses = []
    for run, donor in builder_pairs(runs, runs):
        projected, measured = projection(run, donor), run.summary["tok_per_s"]
        if donor.interpreted_gpu_builder or projected is None or not measured:
            continue
        clauses.append(f"{_where(run.setting, extra)} {projected / measured - 1:+.1%} "
                       f"({STAGE} {crit_ms_per_step(run.summary, STAGE):.3g} -> "
                       f"{crit_ms_per_step(donor.summary, STAGE):.3g} ms per step)")
    return clauses


def _bound_sentence(runs: Sequence[Run]) -> str:
    """E.g. "verify bounds the step in every run (73-76% of step time)", grouped by stage, most common first."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.summary["bound_by"], []).append(run)
    clauses = []
    for stage, members in sorted(groups.items(), key=lambda item: -len(item[1])):
        shares = [f"{run.label} ({_share(bound_share(run))}{' of step time' if i == 0 else ''})"
                  for i, run in enumerate(members)]
        every = "every run: " if len(members) == len(runs) else ""
        clauses.append(f"{stage} bounds tok/s in {every}{_listed(shares)}")
    return "; ".join(clauses) + "."


def _single_run_sentence(run: Run) -> str:
    summary = run.summary
    ms_per_step = summary["step_ms"]["total"] / summary["steps"]
    crit = crit_ms_per_step(summary, summary["bound_by"])
    rate = "unknown tok/s" if summary["tok_per_s"] is None else f"{summary['tok_per_s']:.2f} tok/s"
    return (f"{summary['bound_by']} bounds tok/s in {run.label}: {_share(bound_share(run))} of step time "
            f"({crit:.3g} of {ms_per_step:.3g} ms per step on the critical path), at {rate}.")


def headline(runs: Sequence[Run], evidence: Sequence[ABResult] = ()) -> str:
    """The builder comparison (pairs, then A/B files that match no pair), the projection, what bounds the step."""
    clauses, used = _builder_clauses(runs, evidence)
    clauses += [f"{_ab_where(ab)}: {_paired(ab)}" for ab in evidence
                if ab.compares_builders and id(ab) not in used]
    sentences = [f"{GPU} / {CPU} tok/s: {'; '.join(clauses)}."] if clauses else []
    projected = _projection_clauses(runs)
    if projected:
        sentences.append(f"Projected, {CPU} with the {GPU}'s {STAGE} cost: {'; '.join(projected)}.")
    for ab in evidence:
        if not ab.compares_builders:
            a, b = ab.names()
            sentences.append(f"{_topic(ab)}: {b} / {a} tok/s, "
                             f"{_ab_where(ab)}: {_paired(ab)}.")
    sentences.append(_single_run_sentence(runs[0]) if len(runs) == 1 else _bound_sentence(runs))
    return " ".join(sentences)
