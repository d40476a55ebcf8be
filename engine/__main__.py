"""`python -m engine <subcommand>`: each subcommand module registers its own argparse parser."""

from __future__ import annotations

import argparse
import shlex
import sys

from engine import generate, serve, tokenizer, train_drafter, train_target
from engine.errors import EngineError

# Modules with register(subparsers); each sets `run` as its default.
SUBCOMMANDS = [generate, serve, tokenizer, train_target, train_drafter]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine", description="The embedded DDTree engine.")
    subcommands = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.register(subcommands)
    args = parser.parse_args(argv)
    args.command_line = "python -m engine " + shlex.join(sys.argv[1:] if argv is None else argv)  # for run records
    try:
        return args.run(args)
    except EngineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
