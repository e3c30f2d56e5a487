"""``softverbs``: the command-line entry point.

Each subcommand lives in its own module -- the tools under
:mod:`softverbs.cli`, the sample programs under :mod:`softverbs.samples` --
and exposes ``add_arguments(parser)`` and ``run(args) -> int``.  The table
below is the only place that lists them.  A module is imported only when
its subcommand runs, so ``softverbs --help`` is fast and one subcommand's
import error cannot break the others.

Errors.  A user's mistake never shows a traceback; a bug always does.
:func:`main` runs the subcommand under one rule, so no subcommand needs its
own:

* a mistake in the command line: argparse's message, on one line, exit 2
  (:class:`Parser`);
* a mistake in what the user set up -- :class:`UserError` (raised by the
  commands), :class:`~softverbs.errors.ConfigError` (an environment variable
  or the link table), a :class:`~softverbs.errors.PyverbsError` from a verb
  (a missing device, a port in use), or an :class:`OSError` on a file the
  user named (on the command line or in the environment) -- prints
  ``softverbs: COMMAND: MESSAGE`` on one line and exits 1;
* a closed pipe (``softverbs service status | head -2``) and Ctrl-C end
  the command quietly, as they end ``cat``: exit 141 and 130;
* anything else is a bug and propagates with its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from softverbs.errors import UserError

__all__ = ["UserError", "main"]

#: subcommand -> (module under softverbs.cli, or samples.MODULE, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "conformance": ("conformance", "run rdma-core's test suite on softverbs; per-file results"),
    "demo": ("samples.demo",
             "RC ping-pong with SEND, WRITE, READ or atomics; perftest-style summary"),
    "devinfo": ("devinfo", "show devices and ports in ibv_devinfo's format"),
    "exec": ("exec_", "run a program on softverbs: pyverbs, libibverbs and librdmacm"),
    "link": ("link", "add, show and delete UDP (RoCEv2) devices, like 'rdma link'"),
    "rc-pingpong": ("samples.pingpong", "RC SEND ping-pong, interoperable with ibv_rc_pingpong"),
    "uc-pingpong": ("samples.pingpong", "UC SEND ping-pong, interoperable with ibv_uc_pingpong"),
    "ud-pingpong": ("samples.pingpong", "UD SEND ping-pong, interoperable with ibv_ud_pingpong"),
    "res": ("res", "show QPs, CQs, MRs and PDs of every process, like 'rdma resource'"),
    "service": ("service", "start, stop and inspect the device service softverbsd"),
    "stat": ("statistic", "show device and port counters, like 'rdma statistic'"),
    "trace": ("trace", "draw a SOFTVERBS_TRACE file as an HTML ladder diagram of its QPs"),
    "srq-pingpong": ("samples.srq_pingpong", "RC SEND ping-pong over QPs sharing an SRQ, "
                     "interoperable with ibv_srq_pingpong"),
    "xsrq-pingpong": ("samples.xsrq_pingpong", "XRC SRQ ping-pong, modelled on ibv_xsrq_pingpong"),
}

#: exit statuses, as a shell reports a command killed by the signal
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
EXIT_INTERRUPTED = 128 + signal.SIGINT


class Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on one line (the usage is in --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def version() -> str:
    """The version, and whether the hot modules run compiled (softverbs.compiled)."""
    from softverbs import __version__
    from softverbs.compiled import mode

    return f"softverbs {__version__}, {mode()}"


def _top_parser() -> Parser:
    epilog = "commands:\n" + "\n".join(f"  {n:<15}{h}" for n, (_, h) in COMMANDS.items())
    parser = Parser(
        prog="softverbs",
        description="A software RDMA verbs device (pyverbs API, RoCEv2 wire).",
        epilog=epilog + "\n\nRun 'softverbs COMMAND --help' for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-V", "--version", action="version", version=version())
    parser.add_argument("command", nargs="?", metavar="COMMAND", choices=list(COMMANDS))
    return parser


def _command_module(name: str) -> ModuleType:
    """A subcommand's module: ``samples.X`` is a sample program, anything else a tool."""
    return importlib.import_module(f"softverbs.{name}" if "." in name else f"softverbs.cli.{name}")


def command_parser(name: str) -> Parser:
    """The parser of subcommand ``name``, with the module's arguments."""
    module_name, help_text = COMMANDS[name]
    mod = _command_module(module_name)
    parser = Parser(prog=f"softverbs {name}", description=help_text)
    parser.set_defaults(command=name)  # a module serving several subcommands reads this
    mod.add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        rc = _dispatch(args_list)
        sys.stdout.flush()  # a closed pipe shows here, while we can still say nothing
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return rc


def _dispatch(args_list: list[str]) -> int:
    if not args_list or args_list[0].startswith("-"):
        _top_parser().parse_args(args_list)  # handles --help, --version, bad options
        _top_parser().print_help()
        return 2
    name = args_list[0]
    if name not in COMMANDS:
        _top_parser().parse_args(args_list[:1])  # exits with argparse's message
        return 2
    args = command_parser(name).parse_args(args_list[1:])
    mod = _command_module(COMMANDS[name][0])
    try:
        rc: int = mod.run(args)
    except (BrokenPipeError, KeyboardInterrupt):
        raise
    except Exception as exc:
        message = user_message(exc, args_list)
        if message is None:
            raise
        sys.stdout.flush()
        print(f"softverbs: {name}: {message}", file=sys.stderr)
        return 1
    return rc


def user_message(exc: BaseException, argv: Sequence[str] = ()) -> str | None:
    """The one-line message for ``exc`` if it is the user's mistake; None for a bug."""
    from softverbs.errors import ConfigError, PyverbsError

    if isinstance(exc, UserError | ConfigError | PyverbsError):
        return _one_line(str(exc))
    if isinstance(exc, OSError) and exc.filename is not None and _user_named(exc.filename, argv):
        what = exc.strerror or type(exc).__name__
        return _one_line(f"{os.fsdecode(exc.filename)}: {what}")
    return None


def _user_named(filename: object, argv: Sequence[str]) -> bool:
    """Did the user name this file, on the command line or in the environment?"""
    name = os.fsdecode(filename) if isinstance(filename, str | bytes) else str(filename)
    given = {g for g in (*argv, *os.environ.values()) if g}
    return name in given or os.path.abspath(name) in {os.path.abspath(g) for g in given}


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _quiet_broken_pipe() -> int:
    # Python flushes stdout at exit and would complain again: point it at /dev/null.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


#: the width --help is wrapped at in the generated reference (docs/cli.md)
REFERENCE_WIDTH = 100


def reference_markdown() -> str:
    """docs/cli.md: every command's --help, and its actions', from the parsers
    themselves, so the reference cannot drift from the code (tests compare)."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(REFERENCE_WIDTH + 2)  # argparse wraps at COLUMNS - 2
    try:
        parts = [
            "# Command-line reference\n",
            "<!-- Generated from the argparse parsers by softverbs.cli.main.reference_markdown();",
            "     regenerate with: python3 -c 'from softverbs.cli.main import reference_markdown;",
            "     print(reference_markdown(), end=\"\")' > docs/cli.md -->\n",
            "Every `softverbs` command, as `--help` prints it.  See",
            "[quickstart.md](quickstart.md) for a tour and",
            "[environment.md](environment.md) for the environment variables.\n",
            "## softverbs\n",
            _help_block(_top_parser()),
        ]
        for name in COMMANDS:
            parser = command_parser(name)
            parts += [f"## softverbs {name}\n", _help_block(parser)]
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    for sub_name, sub in action.choices.items():
                        parts += [f"### softverbs {name} {sub_name}\n", _help_block(sub)]
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(parts)


def _help_block(parser: argparse.ArgumentParser) -> str:
    return "```text\n" + parser.format_help().rstrip() + "\n```\n"


if __name__ == "__main__":
    sys.exit(main())
