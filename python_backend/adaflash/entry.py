"""The `adaflash` command. A command another package registers (`adaflash.commands`: `serve`, `publish-drafter`,
...) is parsed and run without the core's commands (`adaflash.cli`), whose imports load torch: `adaflash serve`'s
launcher lives as long as its server and runs no model, so it should not hold torch's memory. Every other command,
and `adaflash --help`, goes to `adaflash.cli`."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    registered = {e.name: e for e in entry_points(group="adaflash.commands")}
    if argv and argv[0] in registered:
        parser = argparse.ArgumentParser(prog="adaflash")
        registered[argv[0]].load()(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(argv)
        return args.func(args)
    from adaflash.cli import main as core_main

    return core_main(argv)


if __name__ == "__main__":
    sys.exit(main())
