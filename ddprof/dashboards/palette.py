"""Colours and line styles shared by every figure: a colour always means one owner of step time
(a stage, `other`, a step, a prefill), in the bars, the timeline and the distributions alike.
Builders are never coloured: they are told apart by marker and dash, in neutral greys."""

from ddprof.attribution import OWNERS

STAGE_COLOURS = dict(zip(OWNERS, (
    "#4c78a8",  # draft
    "#e45756",  # tree_build: the stage the toolkit asks about, in the loudest colour
    "#54a24b",  # verify
    "#b279a2",  # accept
    "#9d755d",  # kv_compact
    "#f58518",  # sampling
    "#bab0ac",  # other (also GPU ops launched outside every stage range)
), strict=True))
STEP_COLOUR = "#72b7b2"
PREFILL_COLOUR = "#eeca3b"
BUILDER_INK = "#333333"  # every measured tok/s line; the projection is drawn lighter
PROJECTION_INK = "#8c8c8c"
BUILDER_STYLES = {"CPU heapq": dict(dash="solid", symbol="circle"), "GPU builder": dict(dash="dot", symbol="square")}
OTHER_BUILDER_STYLE = dict(dash="dashdot", symbol="triangle-up")
PROJECTION_STYLE = dict(dash="dash", symbol="diamond-open")
