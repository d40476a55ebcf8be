"""CUDA graph replays on hand-built exports whose answers were worked out by hand (times in ns):
graph work belongs to the stage whose range holds the cudaGraphLaunch, in either nsys mode and
either export schema, also when the host runs ahead and the work runs after the range."""

import json

import pytest

from ddprof.analysis import breakdown
from ddprof.attribution import attribute
from ddprof.errors import DdprofError
from ddprof.load import load
from engine.stages import STEP, TOKENS_MARK
from tests.ddprof.exports import Export
from tests.ddprof.test_attribution import ZERO, totals
from tests.ddprof.test_breakdown_cli import ddprof

CASES = [("2022.4", "node"), ("2025.3", "node"), ("2025.3", "graph")]  # 2022.4 exports no whole-graph records


def running_ahead(schema: str, mode: str) -> Export:
    """One step [0, 100): draft [0, 10) launches graph 1 at 2, verify [10, 20) graph 2 at 12, both
    return at once; accept [20, 30) launches nothing; sampling [30, 100) waits [32, 95) in a stream
    synchronize. Graph 1 runs [20, 55) (kernels [20, 40) [40, 50), a memset [50, 55)), graph 2
    [55, 90) (a kernel [55, 80), a device-to-pageable copy [80, 90)): all after its stage's range."""
    export = Export(schema)
    export.range(STEP, 0, 100)
    for name, start in (("draft", 0), ("verify", 10), ("accept", 20)):
        export.range(name, start, start + 10)
    export.range("sampling", 30, 100)
    export.graph_launch((2, 4), [(20, 40, "kernel"), (40, 50, "kernel"), (50, 55, "memset")], mode=mode, graph=1)
    export.graph_launch((12, 14), [(55, 80, "kernel"), (80, 90, "memcpy")], mode=mode, graph=2)
    export.runtime_call("cudaStreamSynchronize_v3020", 32, 95)
    export.mark(TOKENS_MARK, 100, 4)
    return export


@pytest.mark.parametrize("schema, mode", CASES)
def test_graph_work_after_its_range_belongs_to_the_launching_stage(schema, mode, tmp_path):
    attribution = attribute(load(running_ahead(schema, mode).write(tmp_path / "run.sqlite")))
    # [0,10) draft host | [10,20) verify host | [20,55) graph 1 (draft) over accept's host range
    # | [55,90) graph 2 (verify) | [90,100) sampling host
    assert totals(attribution, "crit_ns") == {**ZERO, "draft": 10 + 35, "verify": 10 + 35, "sampling": 10}
    assert totals(attribution, "crit_gpu_ns") == {**ZERO, "draft": 35, "verify": 35}
    assert totals(attribution, "gpu_ns") == {**ZERO, "draft": 35, "verify": 35}
    assert totals(attribution, "graph_launches") == {**ZERO, "draft": 1, "verify": 1}
    nodes = {"draft": 3, "verify": 2} if mode == "node" else {}  # a whole-graph record is no op
    assert totals(attribution, "gpu_ops") == {**ZERO, **nodes}
    # Only the synchronize waits: the graph's device-to-pageable copy does not make cudaGraphLaunch wait.
    assert totals(attribution, "sync_calls") == {**ZERO, "sampling": 1}
    assert totals(attribution, "wait_ns") == {**ZERO, "sampling": 63}
    assert attribution.graphs.as_dict() == {"mode": mode, "launches": 2, "graph_records": 2 * (mode == "graph"),
                                            "node_ops": 5 * (mode == "node")}
    launched = attribution.gpu_ops.sort("start")
    assert launched["stage"].to_list() == (["draft"] * 3 + ["verify"] * 2 if mode == "node" else ["draft", "verify"])
    assert set(launched["launch_api"]) == {"cudaGraphLaunch"}


def handed_over() -> Export:
    """Step 0 [0, 50): draft [0, 10) launches a graph that runs [60, 90), inside step 1 [55, 120),
    whose draft [55, 65) launches nothing and whose verify [65, 75) launches a graph running
    [115, 130), past the step's end."""
    export = Export("2025.3")
    export.range(STEP, 0, 50)
    export.range("draft", 0, 10)
    export.graph_launch((5, 7), [(60, 75, "kernel"), (75, 90, "kernel")], mode="node", graph=1)
    export.range(STEP, 55, 120)
    export.range("draft", 55, 65)
    export.range("verify", 65, 75)
    export.graph_launch((66, 68), [(115, 130, "kernel")], mode="node", graph=2)
    return export


def test_a_step_owns_the_graph_work_of_the_step_before_while_it_runs(tmp_path):
    """Step 1's ns go to whichever stage's graph runs then: step 0's draft for [60, 90)."""
    attribution = attribute(load(handed_over().write(tmp_path / "run.sqlite")))
    crit = attribution.matrix("crit_ns")
    gpu = attribution.matrix("gpu_ns")
    assert crit[0].tolist() == [10, 0, 0, 0, 0, 0, 40]  # draft host, then nothing runs: other
    # [55,60) draft host | [60,90) step 0's draft graph | [90,115) other | [115,120) verify's graph
    assert crit[1].tolist() == [5 + 30, 0, 5, 0, 0, 0, 25]
    # GPU time counts for the launching step and stage, wherever it runs (verify's past its step).
    assert gpu[0].tolist() == [30, 0, 0, 0, 0, 0, 0] and gpu[1].tolist() == [0, 0, 15, 0, 0, 0, 0]
    assert attribution.gpu_ops.sort("start")["step_id"].to_list() == [0, 0, 1]


def test_breakdown_says_how_graphs_were_recorded(tmp_path):
    for mode in ("node", "graph"):
        path = running_ahead("2025.3", mode).write(tmp_path / f"{mode}.sqlite")
        summary = json.loads(ddprof("breakdown", path, "--json").stdout)
        assert summary["cuda_graphs"]["mode"] == mode
        verify = next(s for s in summary["stages"] if s["stage"] == "verify")
        assert (verify["graph_launches"], verify["gpu_ops"]) == (1, 2 if mode == "node" else 0)
        table = ddprof("breakdown", path).stdout
        assert f"CUDA graphs: {mode} trace, 2 launches" in table and "graphs/step" in table
        assert ("recorded as whole graphs" in table) == (mode == "graph")
    eager = Export("2025.3")
    eager.range(STEP, 0, 100)
    eager.range("draft", 0, 50)
    eager.kernel(10, 20, launch=(1, 2))
    eager_path = eager.write(tmp_path / "eager.sqlite")
    assert json.loads(ddprof("breakdown", eager_path, "--json").stdout)["cuda_graphs"] == {
        "mode": "none", "launches": 0, "graph_records": 0, "node_ops": 0}
    assert "CUDA graphs: none launched" in ddprof("breakdown", eager_path).stdout


def test_graph_launches_without_any_gpu_record_are_refused_in_one_line(tmp_path):
    """What nsys 2022.4 exports of a --cuda-graph-trace=graph capture: the launch calls, no record
    of what they ran. Read as is, every graph's GPU time would be 0."""
    export = Export("2022.4")
    export.range(STEP, 0, 100)
    export.range("verify", 0, 50)
    export.kernel(10, 20, launch=(1, 2))
    export.runtime_call("cudaGraphLaunch_v10000", 5, 8)
    path = export.write(tmp_path / "run.sqlite")
    with pytest.raises(DdprofError, match="1 CUDA graph launches but no GPU record of any graph replay"):
        attribute(load(path))
    done = ddprof("breakdown", path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith(f"ddprof: error: {path}: ") and "--cuda-graph-trace=node" in done.stderr


def test_graph_records_tied_to_no_launch_call_are_refused(tmp_path):
    """If an nsys gave graph work another correlationId than its cudaGraphLaunch's, all of it would
    silently be `other`: refused, saying so."""
    export = Export("2025.3")
    export.range(STEP, 0, 100)
    export.range("verify", 0, 50)
    export.runtime_call("cudaGraphLaunch_v10000", 5, 8)
    export.kernel(10, 20, launch=None, graph_node=1000)  # a node whose correlationId matches no call
    with pytest.raises(DdprofError, match="1 GPU records of CUDA graph replays, none with the correlationId of a "
                                          "graph launch call \\(1 in the trace\\)"):
        attribute(load(export.write(tmp_path / "run.sqlite")))


def test_the_2022_schema_has_no_whole_graph_records(tmp_path):
    export = Export("2022.4")
    export.graph_launch((0, 1), [(2, 3, "kernel")], mode="graph")
    with pytest.raises(ValueError, match="2022.4 schema has no CUPTI_ACTIVITY_KIND_GRAPH_TRACE"):
        export.write(tmp_path / "run.sqlite")


@pytest.mark.parametrize("schema, mode", CASES)
def test_load_reads_graph_nodes_and_records_in_both_schemas(schema, mode, tmp_path):
    trace = load(running_ahead(schema, mode).write(tmp_path / "run.sqlite"))
    ops = trace.gpu_ops.sort("start")
    if mode == "node":
        assert ops["kind"].to_list() == ["kernel", "kernel", "memset", "kernel", "memcpy"]
        assert ops["graph_node_id"].to_list() == [1000, 1001, 1002, 2000, 2001]
        assert ops["graph_id"].null_count() == ops.height
    else:
        assert ops.select("kind", "name", "graph_id", "start", "end").rows() == [
            ("graph", "[graph 1]", 1, 20, 55), ("graph", "[graph 2]", 2, 55, 90)]
        assert ops["graph_node_id"].null_count() == ops.height
    assert ops["launch_start"].unique().sort().to_list() == [2, 12]
    summary = breakdown(attribute(trace))
    assert summary["cuda_graphs"]["launches"] == 2
