"""The `inwire` command: a table of subcommands, each in its own module, imported only when chosen.

Every command module has `add_arguments(parser)` and `run(args)`, which returns the exit status; its
docstring is the command's description. `main` builds the parser with every command's one-line summary
from `COMMANDS` but imports and asks for the arguments of the chosen command alone, so that `inwire decode`
does not load the gateware, the planner or torch. Errors a user can cause (`InwireError`, `OSError`,
`ValueError`, `RuntimeError`) end as one line on stderr, `inwire <command>: <message>`, and exit status 2,
as do a usage error argparse finds (a value of the wrong form, an unknown option) and a module missing
because an extra is not installed (`inwire.extras`: the line names the extra); an
interrupt (SIGINT) exits with 130 after one line saying where the command was (`inwire.progress`); a
reader that closes the output pipe early (`| head`) ends the command quietly with 141, SIGPIPE's status.
"""

import argparse
import importlib
import os
import signal
import sys
import threading

from .. import __version__, extras, progress
from ..errors import InwireError

COMMANDS = {
    "run": ("inwire.cli.run", "the main job on built-in defaults: plan, software aggregator and islands, then the "
                              "same rounds through the simulated gateware"),
    "schedule": ("inwire.cli.schedule", "optimize the rotating-clique schedule for a topology"),
    "serve": ("inwire.cli.serve", "run the software aggregator (bit-exact with the golden model) as a UDP service"),
    "job": ("inwire.cli.job", "make a job file, register it at aggregators (inwire serve), leave it, tear it down"),
    "stream": ("inwire.cli.stream", "run one island per city of a schedule against an aggregator"),
    "decode": ("inwire.cli.decode", "print each frame of a capture as a JSON line"),
    "replay": ("inwire.cli.replay", "run a capture through the simulated gateware"),
    "verilog": ("inwire.cli.verilog", "write the aggregator gateware as Verilog"),
    "build": ("inwire.cli.build", "build a board bitstream with the open flow (YoWASP)"),
    "alveo": ("inwire.cli.alveo", "write the Verilog of the Alveo U200 100 GbE build"),
    "formal": ("inwire.cli.formal", "run the formal checks of the aggregator (SymbiYosys) and print the table"),
    "demo": ("inwire.cli.demo",
             "aggregator and islands in network namespaces, links delayed as in the topology (root)"),
    "lab": ("inwire.cli.lab", "an emulated WAN in network namespaces: each strategy timed against gloo and the "
                              "cost model (root)"),
    "train": ("inwire.cli.train",
              "the training study: islands on digits, sync strategies under one deterministic clock, over seeds "
              "(needs the torch extra)"),
    "bench": ("inwire.cli.bench", "run the benchmarks and write them to one JSON file"),
    "dissector": ("inwire.cli.dissector", "print the Wireshark Lua dissector for the inwire header"),
    "docs": ("inwire.cli.docs", "print the protocol reference (docs/protocol.md)"),
}
"""Command name -> (module, one-line summary). The module is imported only when its command runs."""


class UsageError(InwireError):
    """The command line does not parse: argparse's message, one line."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (`main` prints them as every other error) instead of the
    usage and an exit."""

    def error(self, message):
        # argparse puts "argument --rounds: " before the message of a type; ours name their option already.
        named, _, rest = message.partition(": ")
        if named.startswith("argument ") and rest.startswith(tuple(named[len("argument "):].split("/"))):
            message = rest
        raise UsageError(message)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the description's lines; shows an option's default in its help unless the help names it already
    or there is none to show."""

    def _get_help_string(self, action):
        text = action.help or ""
        shown = action.default is not None and action.default is not False and action.default != argparse.SUPPRESS
        if "default" in text or not shown:
            return text
        return super()._get_help_string(action)


def chosen_command(argv):
    """The command named in `argv` (the first word that is not an option), or None."""
    return next((word for word in argv if not word.startswith("-")), None)


def load(name):
    """The module of command `name`."""
    return importlib.import_module(COMMANDS[name][0])


def build_parser(argv=()):
    """The parser; only the command chosen in `argv` (if any) gets its arguments, and is imported."""
    parser = Parser(
        prog="inwire", description="In-network gradient aggregation: gateware, verification and host tools.")
    parser.add_argument("--version", action="version", version=f"inwire {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = chosen_command(argv)
    for name, (_module, summary) in COMMANDS.items():
        if name != chosen:
            commands.add_parser(name, help=summary, description=summary)
            continue
        module = load(name)
        sub = commands.add_parser(name, help=summary, description=(module.__doc__ or summary).strip(),
                                  formatter_class=HelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser(argv).parse_args(argv)
    except UsageError as error:
        command = chosen_command(argv)
        print(f"inwire{' ' + command if command in COMMANDS else ''}: {error}", file=sys.stderr)
        return 2
    if threading.current_thread() is threading.main_thread():
        # A shell starts background jobs with SIGINT ignored, which Python keeps: Ctrl-C (or kill -INT) must
        # still stop every command.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    progress.reset(args.command)
    try:
        return args.run(args)
    except BrokenPipeError:
        # The reader left (`inwire decode ... | head`): stop quietly with SIGPIPE's status, as a filter does;
        # stdout goes to /dev/null so that the interpreter's flush at exit does not fail on the pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except (InwireError, OSError, ValueError, RuntimeError) as error:
        print(f"inwire {args.command}: {describe(error)}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        # Commands check their extras up front (extras.require); this catches an import they did not foresee.
        extra = extras.extra_of(error)
        if extra is None:
            raise
        print(f"inwire {args.command}: {extras.needs(extra, error.name, 'this command')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        where = progress.where()
        print(f"inwire {args.command}: interrupted{' during ' + where if where else ''}; no output file written",
              file=sys.stderr)
        return 130


def describe(error):
    """One line for the user: an OSError names its file, other errors carry their own message."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return str(error).splitlines()[0] if str(error) else type(error).__name__
