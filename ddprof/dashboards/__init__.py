"""`ddprof dashboard`: plotly figures of one or more runs' breakdowns, on one offline HTML page.

runs.py loads traces and their capture metadata; one module per figure (step_share, throughput,
timeline, distributions); headline.py writes the sentence on top; palette.py holds the colours
every figure shares; page.py assembles the file; terminal.py prints the summary `ddprof dashboard`
shows in the terminal.
"""

# Consecutive steps the step timeline shows (here, not in timeline.py, so the CLI's option can
# name it without importing plotly).
DEFAULT_WINDOW_STEPS = 6
