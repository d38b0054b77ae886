"""One command grammar: every command takes its options as ``key=value`` or ``--key value`` alike.

The config-driven commands (the trainers, eval, tpo, prefs make, estimate-memory) read both in
core/command_line.py (`parse_values`). The argparse commands (generate, export, selfcheck, label, doctor,
report) call `parse_command_line`, which first spells ``key=value`` as ``--key value`` (`flag_argv`);
the pipeline, whose keys are ``key`` and ``stage.key``, spells ``--key value`` as ``key=value``
(`pair_argv`). Their --help lists one option a line with its default (`OptionsHelpFormatter`).
"""

from __future__ import annotations

import argparse
import difflib
import re

from rlhfkit.errors import ConfigError

# a token that reads as key=value: a name, "=", anything (a value such as "a=b" after an option stays a value)
PAIR = re.compile(r"^([A-Za-z][\w-]*)=(.*)$", re.S)
STAGE_PAIR = re.compile(r"^[A-Za-z][\w.-]*=", re.S)  # the pipeline's stage.key=value too
TRUE_WORDS, FALSE_WORDS = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


class OptionsHelpFormatter(argparse.HelpFormatter):
    """argparse's layout, each option's help ending with its default where it has one and does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, [], argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def _long_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """`--some-option` -> its action, keyed by the name with `-` as `_` (``some_option``)."""
    return {s[2:].replace("-", "_"): a for a in parser._actions for s in a.option_strings if s.startswith("--")}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for a in parser._actions if isinstance(a, argparse._SubParsersAction)
            for name, sub in a.choices.items()}


def flag_argv(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """`argv` with every ``key=value`` whose key names an option of `parser` (``-`` and ``_`` alike)
    spelled ``--key value``; a switch's ``key=true`` is ``--key`` and ``key=false`` nothing. A value
    that follows an option stays as it is; a subcommand's options are its own parser's. An unknown
    key is a one-line ConfigError naming the closest option."""
    out: list[str] = []
    options, subs = _long_options(parser), _subparsers(parser)
    takes_value = False
    for arg in argv:
        pair = PAIR.match(arg)
        if takes_value or pair is None:
            if not takes_value and arg in subs:
                options, subs = _long_options(subs[arg]), _subparsers(subs[arg])
            action = options.get(arg[2:].replace("-", "_")) if arg.startswith("--") and "=" not in arg else None
            takes_value = action is not None and action.nargs != 0
            out.append(arg)
            continue
        key, value = pair.group(1).replace("-", "_"), pair.group(2)
        if key not in options:
            close = difflib.get_close_matches(key, list(options), n=1)
            hint = f" (did you mean {close[0]}=?)" if close else ""
            raise ConfigError(f"{parser.prog}: unknown option {pair.group(1)!r}{hint}; see '{parser.prog} --help'")
        flag = next(s for s in options[key].option_strings if s.startswith("--"))
        if options[key].nargs == 0:
            if value.lower() not in TRUE_WORDS + FALSE_WORDS:
                raise ConfigError(f"{parser.prog}: {pair.group(1)}={value!r}: expected true or false")
            out += [flag] if value.lower() in TRUE_WORDS else []
        else:
            out += [flag, value]
    return out


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`parser.parse_args` over `argv` with ``key=value`` and ``--key value`` alike (`flag_argv`)."""
    return parser.parse_args(flag_argv(argv, parser))


def pair_argv(argv: list[str]) -> list[str]:
    """`argv` of a ``key=value`` command with ``--key value`` (and ``--key=value``) spelled
    ``key=value``; a ``--switch`` followed by no value is ``switch=true``."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        following = argv[i + 1] if i + 1 < len(argv) else None
        if arg.startswith("--") and len(arg) > 2 and "=" not in arg and arg not in ("--help",):
            if following is not None and not following.startswith("--") and STAGE_PAIR.match(following) is None:
                out.append(f"{arg[2:]}={following}")
                i += 2
                continue
            out.append(f"{arg[2:]}=true")
        else:
            out.append(arg[2:] if arg.startswith("--") and "=" in arg else arg)
        i += 1
    return out


class RawDescriptionOptionsHelpFormatter(argparse.RawDescriptionHelpFormatter, OptionsHelpFormatter):
    """`OptionsHelpFormatter` for a parser whose description and epilog are laid out by hand."""
