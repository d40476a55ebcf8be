"""An overlapped engine's trace (engine/engine.py, `overlap`): step N+1's host ranges come before
step N's GPU work has run, each step's `sampling` sends its own tokens and then waits for the step
before's, and the `tokens` mark after a step counts what that commit kept. The breakdown must give
each step's GPU work to that step (its launching stage), however late it runs. Times in ns."""

from ddprof.analysis import breakdown
from ddprof.attribution import attribute
from ddprof.load import load
from engine.stages import STAGES, STEP, TOKENS_MARK
from tests.ddprof.exports import Export
from tests.ddprof.test_attribution import ZERO, stage, totals

PINNED = 1  # ENUM_CUDA_MEM_KIND: the engine's landing buffers
STEP_STARTS = (0, 32, 112)
STEP_ENDS = (30, 110, 200)
# Each step's GPU work: its draft graph, its verify graph, then the copy of its tokens (sampling).
GPU = {0: ((30, 60), (60, 100), (100, 105)), 1: ((105, 135), (135, 175), (175, 180)),
       2: ((180, 210), (210, 250), (250, 255))}
WAITS = {1: (53, 106), 2: (133, 181)}  # sampling's wait for the step before's tokens: past its copy's end
COMMITTED = {0: 0, 1: 7, 2: 5}  # the mark after step N: step N-1's tokens (none before the first)


def overlapped() -> Export:
    """Three steps whose stage ranges are 4 ns each from the step's start (sampling runs to its end):
    draft launches a one-kernel graph, verify another, sampling copies the step's tokens to pinned
    memory and waits for the step before's copy. Every step's GPU work runs in the next step's range."""
    export = Export("2025.3")
    for step, (start, end) in enumerate(zip(STEP_STARTS, STEP_ENDS)):
        export.range(STEP, start, end)
        for index, name in enumerate(STAGES[:-1]):
            export.range(name, start + 4 * index, start + 4 * index + 4)
        sampling = start + 4 * (len(STAGES) - 1)
        export.range("sampling", sampling, end)
        draft, verify, copy = GPU[step]
        export.graph_launch((start + 1, start + 2), [(*draft, "kernel")], mode="node", graph=1)
        export.graph_launch((start + 9, start + 10), [(*verify, "kernel")], mode="node", graph=2)
        export.memcpy(*copy, launch=(sampling + 1, sampling + 2), dst_kind=PINNED)
        if step in WAITS:
            export.runtime_call("cudaEventSynchronize_v3020", *WAITS[step])
        export.mark(TOKENS_MARK, end + 1, COMMITTED[step])
    return export


def test_each_steps_gpu_work_belongs_to_that_step(tmp_path):
    attribution = attribute(load(overlapped().write(tmp_path / "run.sqlite")))
    ops = attribution.gpu_ops.sort("start")
    assert ops["step_id"].to_list() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert ops["stage"].to_list() == ["draft", "verify", "sampling"] * 3
    stages = list(STAGES) + ["other"]
    gpu = attribution.matrix("gpu_ns")
    for step, (draft, verify, copy) in GPU.items():
        want = {**ZERO, "draft": draft[1] - draft[0], "verify": verify[1] - verify[0], "sampling": copy[1] - copy[0]}
        assert dict(zip(stages, gpu[step].tolist())) == want
    assert attribution.steps["tokens"].to_list() == [0, 7, 5] and attribution.tokens == 12


def test_the_critical_path_follows_the_running_gpu_work_across_steps(tmp_path):
    """Step 1's range [32, 110) is mostly step 0's GPU work: [32, 60) step 0's draft graph (draft),
    [60, 100) its verify graph, [100, 105) its copy (sampling), then step 1's own draft graph."""
    attribution = attribute(load(overlapped().write(tmp_path / "run.sqlite")))
    crit = dict(zip(list(STAGES) + ["other"], attribution.matrix("crit_ns")[1].tolist()))
    assert crit == {**ZERO, "draft": (60 - 32) + (110 - 105), "verify": 40, "sampling": 5}
    summary = breakdown(attribution)
    assert summary["steps"] == 3 and summary["tokens"] == 12
    sampling, verify = stage(summary, "sampling"), stage(summary, "verify")
    assert sampling["sync_calls"] == 2 and abs(sampling["wait_ms"] - (53 + 48) / 1e6) < 1e-12  # each step but the first
    # Every step's verify graph is that step's 40 ns, none of it lent to the step it ran in.
    assert abs(verify["gpu_ms"] - 3 * 40 / 1e6) < 1e-12 and verify["per_step"]["gpu_ms"]["p50"] == 40 / 1e6
    # The last step's work runs past the last step's end: its GPU time still counts, its run-time cannot.
    assert totals(attribution, "gpu_ns")["draft"] == 90


def test_a_real_capture_of_the_overlapped_engine_breaks_down_whole(tmp_path):
    """The counting half of the contract from the real toolchain (a CPU capture has no GPU work):
    the engine overlapping its steps (on the CPU the static step runs eagerly, reordered as on CUDA)
    under nsys, then ddprof's breakdown: its steps and tokens are the engine's own counts, and every
    step holds each stage once."""
    from ddprof.capture import CaptureRequest, capture
    from ddprof.pipeline import analyse

    result = capture(CaptureRequest(workload="chat", concurrency=3, out=tmp_path / "run", model="tiny", requests=5,
                                    max_new_tokens=12, seed=1, overlap=True))
    assert result.meta["overlap"] is True and result.meta["overlap_scope"].startswith("draft only")
    _, attribution, summary = analyse(result.sqlite)
    assert summary["steps"] == result.meta["steps"] == result.meta["trace_steps"] > 0
    assert summary["tokens"] == result.meta["tokens"] > 0
    assert summary["tok_per_s"] > 0 and summary["bound_by"] in STAGES
    assert sorted(stage["count"] for stage in summary["stages"]) == [summary["steps"]] * len(STAGES)
    assert attribution.steps.height == summary["steps"]
