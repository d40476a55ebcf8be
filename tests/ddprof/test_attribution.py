"""Attribution on hand-built exports whose answers were worked out by hand (times in ns)."""

import polars as pl
import pytest

from ddprof.analysis import breakdown
from ddprof.attribution import attribute
from ddprof.errors import DdprofError
from ddprof.load import load
from engine.stages import DOMAIN, STEP, TOKENS_MARK
from tests.ddprof.exports import DTOH, HTOD, Export

ZERO = {"draft": 0, "tree_build": 0, "verify": 0, "accept": 0, "kv_compact": 0, "sampling": 0, "other": 0}


def analyse(export: Export, tmp_path, **kwargs):
    attribution = attribute(load(export.write(tmp_path / "run.sqlite")), **kwargs)
    return attribution, breakdown(attribution)


def totals(attribution, column: str) -> dict[str, int]:
    sums = attribution.per_step.group_by("owner").agg(total=pl.col(column).sum())
    return {**ZERO, **{row["owner"]: row["total"] for row in sums.iter_rows(named=True)}}


def stage(summary: dict, name: str) -> dict:
    return next(s for s in summary["stages"] if s["stage"] == name)


def test_gpu_op_launched_in_one_stage_owns_time_in_the_next(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    export.range("draft", 0, 30)
    export.range("verify", 30, 90)
    export.kernel(10, 60, launch=(5, 8))  # draft's kernel runs on into verify
    export.kernel(60, 80, launch=(35, 36))
    attribution, summary = analyse(export, tmp_path)
    assert totals(attribution, "crit_ns") == {**ZERO, "draft": 10 + 50, "verify": 20 + 10, "other": 10}
    assert totals(attribution, "crit_gpu_ns") == {**ZERO, "draft": 50, "verify": 20}
    assert totals(attribution, "gpu_ns") == {**ZERO, "draft": 50, "verify": 20}
    assert totals(attribution, "cpu_ns") == {**ZERO, "draft": 30, "verify": 60}
    assert summary["bound_by"] == "draft"
    assert stage(summary, "draft")["crit_share"] == pytest.approx(0.6)
    assert summary["other_crit_ms"] == pytest.approx(10 / 1e6)
    assert attribution.gpu_ops["stage"].to_list() == ["draft", "verify"]
    assert summary["gpu_busy_share"] == pytest.approx(0.7)  # ops run [10, 80) of the 100 ns step


def test_gpu_busy_share_counts_overlapping_ops_once_and_only_inside_steps(tmp_path):
    export = Export()
    for start in (0, 200):
        export.range(STEP, start, start + 100)
        export.range("verify", start, start + 100)
    export.kernel(10, 50, launch=(1, 2))
    export.kernel(30, 70, launch=(3, 4))     # overlaps the first: [10, 70) busy
    export.kernel(150, 180, launch=(5, 6))   # between the steps: no step's time
    export.kernel(250, 330, launch=(205, 206))  # runs past the second step's end: [250, 300) counts
    _, summary = analyse(export, tmp_path)
    assert summary["gpu_busy_share"] == pytest.approx((60 + 50) / 200)


def test_gpu_busy_share_counts_ops_launched_outside_every_stage_range(tmp_path):
    """The critical path gives such an op's time to the host (here `other`), not to a GPU op; the GPU
    is busy all the same (in the real graph export: a copy and a kernel before each step's draft)."""
    export = Export()
    export.range(STEP, 0, 100)
    export.range("draft", 40, 100)
    export.kernel(20, 30, launch=(5, 6))  # launched before draft's range
    export.kernel(50, 60, launch=(45, 46))
    attribution, summary = analyse(export, tmp_path)
    assert totals(attribution, "crit_gpu_ns") == {**ZERO, "draft": 10}
    assert summary["gpu_busy_share"] == pytest.approx(20 / 100)


def test_earliest_launched_op_owns_overlap_even_if_it_started_running_later(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    export.range("draft", 0, 20)
    export.range("verify", 20, 60)
    export.range("accept", 60, 100)
    export.kernel(40, 90, launch=(25, 27))  # launched in verify, runs first
    export.kernel(50, 70, launch=(5, 7))    # launched earlier, in draft, on another stream
    attribution, _ = analyse(export, tmp_path)
    # [0,20) draft host | [20,40) verify host | [40,50) verify op | [50,70) draft op | [70,90) verify op
    # | [90,100) accept host
    assert totals(attribution, "crit_ns") == {**ZERO, "draft": 20 + 20, "verify": 20 + 10 + 20, "accept": 10}


def test_innermost_nested_stage_owns_host_time_while_both_count_their_cpu_and_gpu(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    export.range("verify", 10, 80)
    export.range("sampling", 30, 50)  # nested inside verify on the same thread
    export.kernel(90, 95, launch=(35, 36))  # launched inside both: counts for both stages' gpu_ms
    attribution, summary = analyse(export, tmp_path)
    # [0,10) other | [10,30) verify | [30,50) sampling | [50,80) verify | [80,90) other
    # | [90,95) sampling's op | [95,100) other
    assert totals(attribution, "crit_ns") == {**ZERO, "verify": 50, "sampling": 20 + 5, "other": 25}
    assert totals(attribution, "cpu_ns") == {**ZERO, "verify": 70, "sampling": 20}
    assert totals(attribution, "gpu_ns") == {**ZERO, "verify": 5, "sampling": 5}
    ranges = load(tmp_path / "run.sqlite").ranges.sort("start")
    assert ranges["depth"].to_list() == [0, 1, 2]
    assert ranges["parent"].to_list() == [None, ranges["range_id"][0], ranges["range_id"][1]]
    assert summary["bound_by"] == "verify"


def test_other_domains_and_default_domain_never_leak_into_stages(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    export.range("verify", 10, 60, domain="CCCL")   # torch's CUB ranges
    export.range(STEP, 200, 300, domain="CCCL")
    export.range("draft", 20, 40, domain=None)      # default domain
    export.mark(TOKENS_MARK, 100, 3)
    export.mark(TOKENS_MARK, 100, 1000, domain="CCCL")
    export.mark("other_mark", 100, 50)
    attribution, summary = analyse(export, tmp_path)
    assert summary["steps"] == 1 and summary["tokens"] == 3
    assert totals(attribution, "count") == ZERO
    assert totals(attribution, "crit_ns") == {**ZERO, "other": 100}


def test_domain_ids_are_resolved_per_process(tmp_path):
    export = Export()
    assert export.declare_domain(DOMAIN, pid=1) == 1 and export.declare_domain("CCCL", pid=1) == 2
    assert export.declare_domain("CCCL", pid=2) == 1 and export.declare_domain(DOMAIN, pid=2) == 2
    export.range(STEP, 0, 100, pid=1)
    export.range("verify", 0, 60, pid=1)
    export.range(STEP, 0, 50, pid=2)
    export.range(STEP, 100, 150, pid=2, domain="CCCL")  # domainId 1 in pid 2, the id ddtree has in pid 1
    export.range("draft", 10, 20, pid=2)
    attribution, summary = analyse(export, tmp_path)
    assert attribution.steps.select("pid", "start", "end").rows() == [(1, 0, 100), (2, 0, 50)]
    assert totals(attribution, "crit_ns") == {**ZERO, "draft": 10, "verify": 60, "other": 40 + 40}
    assert summary["wall_s"] == pytest.approx(100e-9)


def test_gpu_ops_of_another_process_do_not_own_a_step(tmp_path):
    export = Export()
    export.range(STEP, 0, 100, pid=1)
    export.range("verify", 0, 100, pid=1)
    export.range(STEP, 0, 100, pid=2)
    export.range("draft", 0, 10, pid=2)
    export.kernel(20, 80, launch=(2, 3), pid=2)  # pid 2's draft kernel, running during pid 1's verify
    attribution, _ = analyse(export, tmp_path)
    per_step = attribution.per_step.filter(attribution.per_step["crit_ns"] > 0).select("step_id", "owner", "crit_ns")
    assert sorted(per_step.rows()) == [(0, "verify", 100), (1, "draft", 10 + 60), (1, "other", 30)]


def test_op_launched_outside_any_stage_range_is_not_attributed(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    export.range("draft", 0, 20)
    export.range("verify", 50, 100)
    export.kernel(30, 70, launch=(25, 26))  # launched in the step between stages
    export.kernel(0, 10, launch=None)       # no runtime call in the trace
    attribution, _ = analyse(export, tmp_path)
    assert totals(attribution, "gpu_ns") == ZERO
    assert totals(attribution, "crit_ns") == {**ZERO, "draft": 20, "verify": 50, "other": 30}
    assert attribution.gpu_ops["stage"].to_list() == [None, None]


def test_stage_ranges_outside_steps_or_on_other_threads_are_not_stage_ranges(tmp_path):
    export = Export()
    export.range("prefill", 0, 50)
    export.range("draft", 10, 20)               # in prefill, before any step
    export.range(STEP, 100, 200)
    export.range("verify", 120, 160, tid=2)     # another thread, during the step
    export.range("accept", 210, 220)            # after the step
    export.range("sampling", 150, 170)
    export.kernel(300, 310, launch=(15, 16))    # launched in the prefill's draft range
    attribution, summary = analyse(export, tmp_path)
    assert totals(attribution, "count") == {**ZERO, "sampling": 1}
    assert totals(attribution, "crit_ns") == {**ZERO, "sampling": 20, "other": 80}
    assert summary["steps"] == 1 and summary["dropped_ranges"]["outside_step"] == 0


def _crossing_export() -> Export:
    export = Export()
    export.range(STEP, 100, 200)
    export.range("sampling", 150, 170)
    export.range("accept", 180, 220)            # runs past the step's end
    export.range("draft", 90, 110)              # starts before it
    return export


def test_stage_ranges_across_a_steps_bounds_are_refused_or_counted_when_dropped(tmp_path):
    with pytest.raises(DdprofError, match=r"run.sqlite: 2 stage ranges in NVTX domain 'ddtree' start before their "
                                          r"step or run past its end \(first: 'draft' .*--drop-incomplete"):
        analyse(_crossing_export(), tmp_path)
    attribution, summary = analyse(_crossing_export(), tmp_path, drop_incomplete=True)
    assert summary["dropped_ranges"] == {"unclosed": 0, "cross_thread": 0, "outside_step": 2}
    assert totals(attribution, "count") == {**ZERO, "sampling": 1}


def test_a_step_without_a_stage_range_is_refused(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    export.range("verify", 10, 90)
    export.range(STEP, 100, 200)  # holds nothing
    with pytest.raises(DdprofError, match=r"run.sqlite: 1 of 2 steps hold no stage range of NVTX domain 'ddtree' "
                                          r"\(first on tid 1 at 0.000 ms\)"):
        analyse(export, tmp_path)


def test_host_wait_is_time_inside_synchronising_calls(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    export.range("sampling", 0, 50)
    export.range("accept", 50, 100)
    export.runtime_call("cudaStreamSynchronize_v3020", 10, 30)
    export.memcpy(36, 39, launch=(35, 40), api="cudaMemcpy_v3020", copy_kind=DTOH)   # blocking D2H: waits
    export.memcpy(41, 44, launch=(40, 45), api="cudaMemcpy_v3020", copy_kind=HTOD)   # H2D: not a wait
    export.memcpy(46, 47, launch=(45, 48), copy_kind=DTOH, dst_kind=1)               # async into pinned: not a wait
    export.memcpy(53, 56, launch=(52, 57), copy_kind=DTOH)                           # async into pageable: waits
    export.runtime_call("cudaDeviceSynchronize", 60, 70)
    export.runtime_call("cudaEventSynchronize_v3020", 90, 95, tid=2)                 # another thread
    attribution, summary = analyse(export, tmp_path)
    assert totals(attribution, "wait_ns") == {**ZERO, "sampling": 20 + 5, "accept": 5 + 10}
    assert stage(summary, "sampling")["busy_ms"] == pytest.approx(25 / 1e6)
    assert stage(summary, "accept")["wait_ms"] == pytest.approx(15 / 1e6)


def test_definitions_over_several_steps(tmp_path):
    export = Export()
    for start, verify_ns, tokens in ((0, 60, 3), (200, 20, 5)):
        export.range(STEP, start, start + 100)
        export.range("draft", start, start + 10)
        export.range("verify", start + 10, start + 10 + verify_ns)
        export.mark(TOKENS_MARK, start + 100, tokens)
    export.mark(TOKENS_MARK, 500, 2)  # after the last step: counted in tokens too
    attribution, summary = analyse(export, tmp_path)
    assert summary["steps"] == 2 and summary["tokens"] == 10
    assert summary["wall_s"] == pytest.approx(300e-9)
    assert summary["tok_per_s"] == pytest.approx(10 / 300e-9)
    verify = stage(summary, "verify")
    assert verify["count"] == 2
    assert verify["cpu_ms"] == pytest.approx(80e-6) and verify["cpu_share"] == pytest.approx(80 / 200)
    assert verify["crit_ms"] == pytest.approx(80e-6) and verify["crit_share"] == pytest.approx(0.4)
    assert verify["gpu_ms"] is None and summary["gpu_activity"] is False
    assert verify["per_step"]["crit_ms"]["p50"] == pytest.approx(40e-6)
    assert verify["per_step"]["crit_ms"]["p90"] == pytest.approx(56e-6)  # linear between 20 and 60
    # Serial steps: a free verify saves its 80 ns of critical path off the 300 ns wall.
    assert verify["what_if"]["tok_per_s_if_free"] == pytest.approx(10 / 220e-9)
    assert summary["other_crit_ms"] == pytest.approx(100e-6)
    assert summary["bound_by"] == "verify"
    assert attribution.steps["tokens"].to_list() == [3, 5 + 2]
    shares = [s["crit_share"] for s in summary["stages"]] + [summary["other_crit_share"]]
    assert sum(shares) == pytest.approx(1.0)


def test_gpu_only_projection_removes_only_host_owned_crit_time(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    export.range("tree_build", 0, 100)
    export.kernel(60, 100, launch=(10, 12))
    export.mark(TOKENS_MARK, 100, 4)
    _, summary = analyse(export, tmp_path)
    tree = stage(summary, "tree_build")
    assert tree["crit_gpu_ms"] == pytest.approx(40e-6) and tree["crit_host_ms"] == pytest.approx(60e-6)
    assert tree["what_if"]["tok_per_s_if_gpu_only"] == pytest.approx(4 / 40e-9)
    assert tree["what_if"]["tok_per_s_if_free"] is None  # nothing left: no wall time


def test_tokens_from_any_integer_payload_column(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    for column, value in (("int64Value", 1), ("uint64Value", 2), ("int32Value", 4), ("uint32Value", 8)):
        export.mark(TOKENS_MARK, 100, value, payload_column=column)
    _, summary = analyse(export, tmp_path)
    assert summary["tokens"] == 15


def test_tokens_mark_without_integer_payload_is_an_error(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    export.mark(TOKENS_MARK, 100, None)
    with pytest.raises(DdprofError, match=r"run.sqlite: 1 'tokens' marks .* carry no integer payload"):
        analyse(export, tmp_path)


def test_overlapping_steps_on_one_thread_are_refused(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    export.range(STEP, 50, 150, start_end=True)
    with pytest.raises(DdprofError, match="run.sqlite: 1 step ranges start before the previous step"):
        analyse(export, tmp_path)


def _incomplete_export() -> Export:
    export = Export()
    export.range(STEP, 0, 100)
    export.range("verify", 10, 50, start_end=True, end_tid=2)  # ended on another thread
    export.range(STEP, 200, None)                             # never closed (end NULL)
    export.range("draft", 210, 10_000)                        # closed by nsys at the trace's end
    export.range("verify", 300, 400, domain="CCCL", start_end=True, end_tid=3)  # not ours: ignored
    export.trace_end = 10_000
    return export


def test_unclosed_and_cross_thread_ranges_are_an_error_that_counts_them(tmp_path):
    with pytest.raises(DdprofError, match=r"run.sqlite: 2 unclosed and 1 cross-thread step/stage ranges .*"
                                          r"--drop-incomplete"):
        analyse(_incomplete_export(), tmp_path)


def test_dropping_incomplete_ranges_counts_what_was_left_out(tmp_path):
    attribution, summary = analyse(_incomplete_export(), tmp_path, drop_incomplete=True)
    assert summary["dropped_ranges"] == {"unclosed": 2, "cross_thread": 1, "outside_step": 0}
    assert summary["steps"] == 1
    assert totals(attribution, "crit_ns") == {**ZERO, "other": 100}


def test_no_step_ranges_suggests_a_stage_map(tmp_path):
    export = Export()
    export.range("forward", 0, 100, domain="sglang")
    with pytest.raises(DdprofError, match=r"run.sqlite: no step ranges \('step'\) in NVTX domain 'ddtree' "
                                          r"\(domains with ranges: sglang\); .* --stage-map FILE"):
        analyse(export, tmp_path)
