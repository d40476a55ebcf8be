"""Colours shared by every figure, so a stage (or a builder) looks the same everywhere on the page."""

from ddprof.attribution import OWNERS

STAGE_COLOURS = dict(zip(OWNERS, (
    "#4c78a8",  # draft
    "#e45756",  # tree_build: the stage the toolkit asks about, in the loudest colour
    "#54a24b",  # verify
    "#b279a2",  # accept
    "#9d755d",  # kv_compact
    "#f58518",  # sampling
    "#bab0ac",  # other
), strict=True))
STEP_COLOUR = "#72b7b2"
PREFILL_COLOUR = "#eeca3b"
UNATTRIBUTED_COLOUR = "#606060"  # GPU ops launched outside every stage range
BUILDER_COLOURS = {"CPU heapq": "#4c78a8", "GPU builder": "#e45756"}
OTHER_BUILDER_COLOUR = "#7f7f7f"
