"""``softverbs``: the command-line entry point.

Each subcommand lives in its own module under :mod:`softverbs.cli` and
exposes ``add_arguments(parser)`` and ``run(args) -> int``.  The table
below is the only place that lists them.  A module is imported only when
its subcommand runs, so ``softverbs --help`` is fast and one subcommand's
import error cannot break the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: subcommand -> (module under softverbs.cli, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "conformance": ("conformance", "run rdma-core's test suite on softverbs; per-file results"),
    "demo": ("demo", "RC ping-pong on the embedded device, with a perftest-style summary"),
    "exec": ("exec_", "run a program with softverbs standing in for pyverbs"),
    "link": ("link", "add, show and delete UDP (RoCEv2) devices, like 'rdma link'"),
    "rc-pingpong": ("pingpong", "RC SEND ping-pong, interoperable with ibv_rc_pingpong"),
    "uc-pingpong": ("pingpong", "UC SEND ping-pong, interoperable with ibv_uc_pingpong"),
    "ud-pingpong": ("pingpong", "UD SEND ping-pong, interoperable with ibv_ud_pingpong"),
    "service": ("service", "start, stop and inspect the device service softverbsd"),
    "xsrq-pingpong": ("xsrq_pingpong", "XRC SRQ ping-pong, modelled on ibv_xsrq_pingpong"),
}


def _top_parser() -> argparse.ArgumentParser:
    epilog = "commands:\n" + "\n".join(f"  {n:<14}{h}" for n, (_, h) in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="softverbs",
        description="A software RDMA verbs device (pyverbs API, RoCEv2 wire).",
        epilog=epilog + "\n\nRun 'softverbs COMMAND --help' for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", nargs="?", metavar="COMMAND", choices=list(COMMANDS))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or args_list[0].startswith("-"):
        _top_parser().parse_args(args_list)  # handles --help
        _top_parser().print_help()
        return 2
    name = args_list[0]
    if name not in COMMANDS:
        _top_parser().parse_args(args_list[:1])  # exits with argparse's message
        return 2
    module_name, help_text = COMMANDS[name]
    mod = importlib.import_module(f"softverbs.cli.{module_name}")
    parser = argparse.ArgumentParser(prog=f"softverbs {name}", description=help_text)
    parser.set_defaults(command=name)  # a module serving several subcommands reads this
    mod.add_arguments(parser)
    args = parser.parse_args(args_list[1:])
    rc: int = mod.run(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
