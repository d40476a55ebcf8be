"""The regression gate of `ddprof compare --fail-if`: rules on the breakdown's fields, judged by
the bootstrap CI of the change from run A (the baseline) to run B.

A CI job compares its run against a baseline and fails on a regression. Run-to-run noise moves a
point estimate across any threshold now and then, so a rule flags a regression only when the
whole confidence interval of the change lies past its threshold: a small, noisy difference whose
interval reaches back across the threshold passes.

A rule is `FIELD < N%` or `FIELD > N%` with N signed as the change is (`tok_per_s < -3%`: tok/s
fell by more than 3%; `verify.crit_ms > +5%`: verify's critical path grew by more than 5%). FIELD
is a key of `ddprof breakdown --json`: a top-level one, or STAGE.KEY of a row of its `stages`.
Runs differ in length, so every field but tok_per_s is compared per step: verify.crit_ms as
verify's critical-path ms per step, a share as the share of the runs' step time.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ddprof.errors import DdprofError
from engine.stages import STAGES  # light imports only: the CLI's --help lists the fields

STEP_TIME = "step_ns"  # the per-step quantity a share divides by; also step_ms.total's own


@dataclass(frozen=True)
class Measure:
    """A field as per-step columns of the attribution (ddprof.attribution.PER_STEP_COLUMNS, or
    STEP_TIME): `terms` summed with their signs for `owner` (a stage; None: `other`, the step time
    no stage owns), over step time when `share`; `unit` converts it to the field's unit (ns to ms)."""
    owner: str | None
    terms: tuple[tuple[str, int], ...]
    share: bool = False
    unit: float = 1.0


_NS_PER_MS = 1e6
# A stage row's keys, as per-step columns of that stage.
_STAGE_KEYS = {
    "count": ((("count", 1),), False, 1.0),
    "cpu_ms": ((("cpu_ns", 1),), False, _NS_PER_MS),
    "cpu_share": ((("cpu_ns", 1),), True, 1.0),
    "gpu_ms": ((("gpu_ns", 1),), False, _NS_PER_MS),
    "crit_ms": ((("crit_ns", 1),), False, _NS_PER_MS),
    "crit_share": ((("crit_ns", 1),), True, 1.0),
    "crit_gpu_ms": ((("crit_gpu_ns", 1),), False, _NS_PER_MS),
    "crit_host_ms": ((("crit_ns", 1), ("crit_gpu_ns", -1)), False, _NS_PER_MS),
    "wait_ms": ((("wait_ns", 1),), False, _NS_PER_MS),
    "busy_ms": ((("cpu_ns", 1), ("wait_ns", -1)), False, _NS_PER_MS),
    "gpu_ops": ((("gpu_ops", 1),), False, 1.0),
    "graph_launches": ((("graph_launches", 1),), False, 1.0),
    "sync_calls": ((("sync_calls", 1),), False, 1.0),
}
TOK_PER_S = "tok_per_s"  # the one field compared as a rate of the whole run (compare's tok/s ratio)
MEASURES: dict[str, Measure] = {
    "other_crit_ms": Measure(None, (("crit_ns", 1),), unit=_NS_PER_MS),
    "other_crit_share": Measure(None, (("crit_ns", 1),), share=True),
    "step_ms.total": Measure(None, ((STEP_TIME, 1),), unit=_NS_PER_MS),
    **{f"{stage}.{key}": Measure(stage, terms, share, unit)
       for stage in STAGES for key, (terms, share, unit) in _STAGE_KEYS.items()},
}
FIELDS_HELP = (f"{TOK_PER_S}, {', '.join(k for k in MEASURES if '.' not in k or k.startswith('step_'))}, "
               f"STAGE.{{{', '.join(_STAGE_KEYS)}}} for STAGE in {', '.join(STAGES)}")
_RULE = re.compile(r"\s*([A-Za-z_][\w.]*)\s*([<>])\s*([+-]?(?:\d+\.?\d*|\.\d+))\s*%\s*")


@dataclass(frozen=True)
class Rule:
    """One --fail-if: a regression when the CI of FIELD's change (in %) lies wholly below (`<`)
    or wholly above (`>`) `threshold_pct`."""
    text: str
    field: str
    above: bool
    threshold_pct: float


def parse_rule(text: str) -> Rule:
    """A --fail-if expression, or a one-line DdprofError saying what is wrong with it."""
    match = _RULE.fullmatch(text)
    if not match:
        raise DdprofError(f"--fail-if {text!r}: expected FIELD < N% or FIELD > N%, e.g. 'tok_per_s < -3%' or "
                          "'verify.crit_ms > +5%'")
    field, op, threshold = match.groups()
    if field != TOK_PER_S and field not in MEASURES:
        raise DdprofError(f"--fail-if {text!r}: {field} is not a breakdown field; fields: {FIELDS_HELP}")
    return Rule(text.strip(), field, op == ">", float(threshold))


def verdict(rule: Rule, a: float, b: float, change_pct: float, ci_pct: list[float]) -> dict:
    """The JSON verdict of one rule: both runs' values, the change and its CI (in %; an end is
    null where unbounded: resamples of A without the field), and whether it is a regression."""
    low, high = ci_pct
    regression = low > rule.threshold_pct if rule.above else high < rule.threshold_pct
    return {"rule": rule.text, "field": rule.field, "op": ">" if rule.above else "<",
            "threshold_pct": rule.threshold_pct, "a": a, "b": b, "change_pct": change_pct,
            "change_ci_pct": [end if math.isfinite(end) else None for end in ci_pct], "regression": bool(regression)}


def describe(v: dict, confidence: float) -> str:
    """One line naming a verdict: the rule, the change and its interval."""
    per = "" if v["field"] == TOK_PER_S else " per step"
    low, high = (f"{end:+.2f}%" if end is not None else "unbounded" for end in v["change_ci_pct"])
    return (f"{v['field']} changed {v['change_pct']:+.2f}%{per} ({v['a']:.6g} -> {v['b']:.6g}; "
            f"{confidence * 100:.0f}% CI {low} .. {high}), wholly past the rule '{v['rule']}'")
