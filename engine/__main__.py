"""`python -m engine <subcommand>`: each subcommand module registers its own argparse parser."""

from __future__ import annotations

import argparse
import sys

from engine import generate, serve
from engine.errors import EngineError

SUBCOMMANDS = [generate, serve]  # modules with register(subparsers); each sets `run` as its default


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine", description="The embedded DDTree engine.")
    subcommands = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.register(subcommands)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except EngineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
