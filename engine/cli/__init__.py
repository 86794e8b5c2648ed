"""`prune`: one command line with subcommands.

prune export  --model CHECKPOINT --out build/provence
prune run     --model build/provence --question "..." --context-file doc.txt
prune compress --model LLMLINGUA2_CHECKPOINT --rate 0.33 --force-tokens "\\n" "?" --file prompt.txt
prune index   --db rag.db --data docs.jsonl
prune ask     --db rag.db --question "..."
prune mcp     --model build/provence --compressor build/lingua   (an MCP server for agents, on stdio)
prune test-checkpoint --family all --out build/test-checkpoints
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys

from engine.cli import (
    api,
    ask,
    bench,
    capacity,
    compress,
    eval,
    export,
    fidelity,
    index,
    mcp,
    repository,
    run,
    serve,
    test_checkpoint,
)
from engine.errors import PruneError

#: the subcommands, in `prune --help`'s order: one module each, the command's flags beside
#: its handler (`add(new)` makes its parser, `run(args)` runs it)
COMMANDS = (
    export,
    run,
    compress,
    eval,
    fidelity,
    repository,
    api,
    mcp,
    serve,
    bench,
    capacity,
    index,
    ask,
    test_checkpoint,
)


def build_parser() -> argparse.ArgumentParser:
    """The `prune` command's parser, every subcommand with its flags."""
    import engine

    p = _Parser(prog="prune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"prune-engine {engine.__version__}")
    # also before the subcommand (`prune -q run ...`); own names, or the subcommand's defaults win
    top = p.add_mutually_exclusive_group()
    top.add_argument(
        "-q", "--quiet", dest="top_quiet", action="store_true", help="as the subcommands' --quiet"
    )
    top.add_argument(
        "-v", "--verbose", dest="top_verbose", action="store_true", help="as the subcommands' --verbose"
    )
    sub = p.add_subparsers(dest="command", required=True)
    p.commands = sub.choices  # name -> the subcommand's parser (main's errors name it)
    output = argparse.ArgumentParser(add_help=False)
    loud = output.add_argument_group("output").add_mutually_exclusive_group()
    loud.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="nothing on stderr but errors: no progress, notes or server logs",
    )
    loud.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="more on stderr: Python logging at DEBUG and a traceback with every error",
    )

    def new(name: str, **kwargs) -> argparse.ArgumentParser:
        """A subcommand's parser: its help shows the defaults once, and -q / -v."""
        return sub.add_parser(name, formatter_class=_HelpFormatter, parents=[output], **kwargs)

    for command in COMMANDS:
        command.add(new)
    return p


class _Parser(argparse.ArgumentParser):
    """argparse's parser (the subcommands' too) with its errors on one line, as every other
    input error of `prune` (`prune run: error: ...`, exit 2): the usage is --help's, and a
    misspelt option of a subcommand is told its nearest ("did you mean --passages-file?"). No
    option is abbreviated (`prune run --text x` is an error, not `--text-model x`): every
    subcommand's parser is one of these."""

    def __init__(self, *args, **kwargs):
        """argparse's parser with `allow_abbrev` off, whatever the caller says."""
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, remembering the words it was given (a subcommand: its own)."""
        self.given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        """Print `prog: error: message` and a pointer to --help on one line; exit 2."""
        self.exit(
            2, f"{self.prog}: error: {message}{self.suggestions()} ({self.prog} --help shows the usage)\n"
        )

    def suggestions(self) -> str:
        """ "; did you mean --x?" for each word given that looks like a misspelt option of this
        parser (a subcommand's: the top parser's words hold every subcommand's options)."""
        if self._subparsers is not None:  # the top parser: a misspelt subcommand
            commands = list(getattr(self, "commands", {}))
            words = [w for w in getattr(self, "given", []) if not w.startswith("-")][:1]
            near = difflib.get_close_matches(words[0], commands, n=1, cutoff=0.5) if words else []
            return f"; did you mean {near[0]} (not {words[0]})?" if near and words[0] not in commands else ""
        known = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        hints = []
        for word in getattr(self, "given", []):
            name = word.split("=", 1)[0]
            if not name.startswith("--") or name in known:
                continue
            same, longer = _SAME_JOB.get(name), [k for k in known if k.startswith(name)]
            near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            if same in known:
                hints.append(f"did you mean {same} (not {name})?")
            elif longer:
                hints.append(f"options are not abbreviated: {name} is not {' or '.join(longer[:3])}")
            elif near:
                hints.append(f"did you mean {near[0]} (not {name})?")
        return "".join(f"; {h}" for h in hints)


#: a flag of one subcommand and the flag another names the same input with: `prune compress
#: --text` is the prompt, `prune run --context` a passage (a hint for either where it is unknown)
_SAME_JOB = {"--text": "--context", "--context": "--text"}


def _logger(args):
    if args.quiet:
        return lambda m: None
    return lambda m: print(m, file=sys.stderr, flush=True)


class _HelpFormatter(argparse.HelpFormatter):
    """Adds "(default: X)" to a flag's help only where the help does not say its default
    already and there is one worth saying (not None, not a switch's True/False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or isinstance(default, bool)
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


def main(argv: list[str] | None = None) -> int:
    """Run `prune` with `argv`; the exit status."""
    try:
        parser = build_parser()
    except PruneError as exc:  # a PRUNE_* variable that does not parse
        print(f"prune: error: {exc}", file=sys.stderr)
        return 2
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # told by the subcommand's parser, which knows its options (and its --help)
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    args.quiet = args.quiet or args.top_quiet
    args.verbose = args.verbose or args.top_verbose
    if args.quiet and args.verbose:
        print(f"prune {args.command}: error: --quiet and --verbose exclude each other", file=sys.stderr)
        return 2
    args.log = _logger(args)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command, for a report beside its figures
    if args.verbose:
        import logging

        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return args.func(args)
    except BrokenPipeError:
        # the reader went away (`prune run --json | head`): end quietly, as Unix tools do
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except (PruneError, ValueError, OSError) as exc:
        # ValueError: invalid batching settings and the like; OSError: a file that cannot be read or
        # written (the commands check theirs first; this catches what a check cannot foresee)
        if args.verbose:
            import traceback

            traceback.print_exc()
        print(f"prune {args.command}: error: {exc}", file=sys.stderr)
        return 2
