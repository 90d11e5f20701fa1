"""The ``optw`` command line: each concern's module adds its subcommands with
``register(subparsers)``; handlers import torch, Ray and MLflow only when they run."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from optw.errors import OptwError

#: Modules that add subcommands, in help order.
COMMAND_MODULES = ("optw.catalog.cli", "optw.decode.cli", "optw.train.cli",
                   "optw.baselines.cli", "optw.evaluate.cli", "optw.distributed.cli",
                   "optw.serve.cli", "optw.report.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="optw", description="Train, evaluate and serve neural "
                                     "solvers for the Orienteering Problem with Time Windows.")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error instead of one line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _one_line(text: str) -> str:
    """A message with whitespace runs joined, unless it lists several lines (one per pack)."""
    return " ".join(text.split()) if text.count("\n") < 2 else text.strip()


def main(argv: list[str] | None = None) -> int:
    """Run one command: an OptwError is one line, exit 2; any other error a bug, exit 1
    (``--debug``: the same exit codes, after the traceback)."""
    args = build_parser().parse_args(argv)
    name = " ".join(filter(None, (args.command, getattr(args, f"{args.command}_command", None))))
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`optw catalog list --json | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OptwError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"optw {name}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - anything else is a bug: said so, in one line
        if args.debug:
            raise  # the interpreter's traceback, exit 1
        last = traceback.extract_tb(exc.__traceback__)[-1]
        print(f"optw {name}: internal error (a bug, please report it): {type(exc).__name__}: "
              f"{' '.join(str(exc).split())[:500]} (at {last.filename}:{last.lineno} in "
              f"{last.name}; `optw --debug {name} ...` shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
