"""CUDA graph replays in a trace: how nsys recorded them, and what of them counts as an op.

A replay is one `cudaGraphLaunch` call. nsys records its GPU side one of two ways (`nsys profile
--cuda-graph-trace`): `node`, every kernel, memcpy and memset node as an op of its own that carries
the launch's correlationId and its graphNodeId; `graph` (nsys's default), one whole-graph record
(CUPTI_ACTIVITY_KIND_GRAPH_TRACE) spanning the replay, again with the launch's correlationId.
Either way ddprof.load joins the record to its launch call like any op, so a graph's work belongs
to the stage whose range holds the cudaGraphLaunch, whenever it runs. What differs is what can be
counted: a node trace has every node as an op; a graph trace only knows that a replay ran from its
first node's start to its last one's end (so its GPU time includes the idle gaps between nodes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import polars as pl

from ddprof.errors import DdprofError
from ddprof.load import GRAPH, Trace

GRAPH_LAUNCH_APIS = ("cudaGraphLaunch", "cuGraphLaunch")  # runtime and driver API (suffixes stripped)
NODE_MODE, GRAPH_MODE, NO_GRAPHS = "node", "graph", "none"
_KEY_SPAN = 1 << 32  # correlation ids are 32-bit: pid * span + id is one launch


@dataclass(frozen=True)
class GraphTrace:
    """mode: node | graph | none (a trace with both kinds of record: "node+graph");
    launches: graph launch calls; graph_records: whole-graph records; node_ops: ops run as graph nodes."""

    mode: str
    launches: int
    graph_records: int
    node_ops: int

    def as_dict(self) -> dict:
        return asdict(self)


def graph_trace(trace: Trace) -> GraphTrace:
    """How the trace recorded its graph replays; refuses one whose replays left no GPU record at all
    (every graph's GPU time would read as 0, the GPU idle, when it was not), and one whose graph
    records name no launch call (all graph work would be `other`)."""
    launches = int(trace.runtime["api"].is_in(GRAPH_LAUNCH_APIS).sum())
    ops = trace.gpu_ops
    of_graphs = ops.filter((pl.col("kind") == GRAPH) | pl.col("graph_node_id").is_not_null())
    records = int((of_graphs["kind"] == GRAPH).sum())
    nodes = of_graphs.height - records
    if of_graphs.height and not of_graphs["launch_api"].is_in(GRAPH_LAUNCH_APIS).any():
        raise DdprofError(
            f"{trace.source}: {of_graphs.height} GPU records of CUDA graph replays, none with the correlationId of "
            f"a graph launch call ({launches} in the trace): this nsys ties graph work to its launch some other way "
            "than ddprof reads, and every graph's work would count as launched outside every stage")
    if launches and not of_graphs.height:
        raise DdprofError(
            f"{trace.source}: {launches} CUDA graph launches but no GPU record of any graph replay (nsys "
            "--cuda-graph-trace=graph, its default, exported by an nsys whose SQLite export has no "
            "CUPTI_ACTIVITY_KIND_GRAPH_TRACE table, such as 2022.4): every graph's GPU time would read as 0; "
            "capture with --cuda-graph-trace=node, as ddprof capture does")
    mode = "+".join(m for m, n in ((NODE_MODE, nodes), (GRAPH_MODE, records)) if n) or NO_GRAPHS
    return GraphTrace(mode, launches, records, nodes)


def op_counts(gpu_ops: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per op: whether it is a GPU op (a kernel, memcpy or memset, graph nodes included; a
    whole-graph record is a replay, not an op), and whether it opens a graph launch (its record, or
    the first listed node of its launch), as 0/1 weights."""
    is_record, is_node = pl.col("kind") == GRAPH, pl.col("graph_node_id").is_not_null()
    launch = pl.when(is_node).then(pl.col("pid") * _KEY_SPAN + pl.col("correlation_id"))  # null for other ops
    flags = gpu_ops.select(is_op=~is_record, opens=is_record | (is_node & launch.is_first_distinct()))
    return flags["is_op"].cast(pl.Int64).to_numpy(), flags["opens"].cast(pl.Int64).to_numpy()
