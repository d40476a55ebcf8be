"""`python -m ddprof ...`: the same CLI as the `ddprof` console script (for machines without it)."""

from ddprof.cli import main

main()
