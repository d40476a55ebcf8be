"""How several ranks look in a terminal: the per-rank stage table, the critical path over the
ranks with its communication column, the stragglers; and each rank's gaps. Presentation only:
every number comes from ddprof.ranks (or ddprof.gaps), so the tables and `--json` agree."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from ddprof.report import _num, _pct, _table, gaps_view


def ranks_view(summary: dict) -> Group:
    crit = summary["critical_path"]
    ranks = summary["ranks"]
    bound = next(row for row in crit["stages"] if row["stage"] == crit["bound_by"])
    headline = Text.assemble(
        (f"{', '.join(summary['sources'])}\n", "bold"),
        f"{len(ranks)} ranks · {summary['matched_steps']} steps matched by index · "
        f"{_num(crit['tokens'], '{}')} tokens · {_num(crit['tok_per_s'], '{:.1f} tok/s')} on the critical path · "
        "bound by ", (crit["bound_by"], "bold red"), f" ({_pct(bound['crit_share'])} of its step time)\n",
        (f"a step's critical path is its slowest rank's; communication: {summary['communication']}", "dim"))
    per_rank = _table("per rank: crit ms (critical-path time the stage owns on that rank) and comm ms",
                      ("stage", *(f"rank {r['rank']} {what}" for r in ranks for what in ("crit ms", "comm ms"))))
    for code, row in enumerate(crit["stages"]):
        per_rank.add_row(row["stage"], *(_num(r["stages"][code][key]) for r in ranks for key in ("crit_ms", "comm_ms")))
    per_rank.add_row("step (mean ms)", *(cell for r in ranks for cell in (_num(r["step_ms"]["total"] / r["steps"]), "")),
                     style="dim")
    critical = _table("critical path over the ranks: each step as its slowest rank ran it",
                      ("stage", "crit ms", "crit %", "comm ms", "comm % of crit"))
    for row in crit["stages"]:
        critical.add_row(row["stage"], _num(row["crit_ms"]), _pct(row["crit_share"]), _num(row["comm_ms"]),
                         _pct(row["comm_ms"] / row["crit_ms"] if row["crit_ms"] else None),
                         style="bold" if row["stage"] == crit["bound_by"] else None)
    critical.add_row("other", _num(crit["other_crit_ms"]), _pct(crit["other_crit_share"]), "", "", style="dim")
    stragglers = _table("stragglers: in how many steps each rank was the slowest, and by how much the fastest "
                        "rank of those steps was faster", ("rank", "slowest in", "share", "by ms (mean)", "by ms (total)",
                                                       "step ms (mean)"))
    for row in summary["stragglers"]:
        stragglers.add_row(f"rank {row['rank']}", str(row["slowest_steps"]), _pct(row["share"]),
                           _num(row["behind_ms_mean"]), _num(row["behind_ms_total"]), _num(row["step_ms_mean"]))
    notes = []
    if len(set(summary["step_counts"])) > 1:
        notes.append(f"the ranks ran {', '.join(map(str, summary['step_counts']))} steps: only the first "
                     f"{summary['matched_steps']} are matched")
    return Group(headline, per_rank, critical, stragglers, *(Text(f"note: {n}", style="yellow") for n in notes))


def ranks_gaps_view(result: dict) -> Group:
    return Group(*(item for rank in result["ranks"]
                   for item in (Text(f"rank {rank['rank']}", style="bold underline"), gaps_view(rank))))
