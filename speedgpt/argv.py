"""Command-line helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import sys


class Parser(argparse.ArgumentParser):
    """argparse's parser with its errors as one line: the stock one printed its whole usage block (up to nine lines
    for `train`) above the error, where every other refusal of speedgpt's is one line naming the fix. The
    subcommands' parsers (add_subparsers) are of this class too."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)", file=sys.stderr)
        sys.exit(2)


def bind_values(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """`--opt VALUE` as `--opt=VALUE` for the given options, so a value that starts with "--" (a
    string of overrides such as "--model.fp8_head=false") is not taken by argparse for an option."""
    bound, i = [], 0
    while i < len(argv):
        if argv[i] in options and i + 1 < len(argv):
            bound.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            bound.append(argv[i])
            i += 1
    return bound


_SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def count(text: str) -> int:
    """An argparse type for counts (tokens, characters): a whole number written as the help texts write
    defaults, "100000000", "1e8", "100M", "2.5B" or "100_000_000" (K, M, B or G, T: powers of 1000).
    Plain `int` refused the forms the help showed ("default 1e9")."""
    from decimal import Context, Decimal, Inexact, InvalidOperation, Overflow, Underflow

    s = text.strip().replace("_", "")
    scale = _SUFFIXES.get(s[-1:].upper(), 1)
    if scale != 1:
        s = s[:-1]
    too_large = argparse.ArgumentTypeError(f"{text!r} is too large (at most 2**63 - 1)")
    not_whole = argparse.ArgumentTypeError(f"{text!r} is not a whole number (e.g. 100000000, 1e8, 100M, 2.5B)")
    # Exact decimal arithmetic ("2.5B", "1e9" are whole numbers; a float would round them), where any rounding
    # raises and exponents stay small: "1e999999999" must not build a billion-digit int.
    exact = Context(prec=40, Emax=40, Emin=-40, traps=[InvalidOperation, Overflow, Underflow, Inexact])
    try:
        value = exact.multiply(Decimal(s), scale)
    except Overflow:
        raise too_large from None
    except ArithmeticError:  # not a number, or one rounded away ("1e-99")
        raise not_whole from None
    if not value.is_finite() or value != value.to_integral_value(context=exact):
        raise not_whole
    if abs(value) >= 2**63:
        raise too_large
    return int(value)


def require_subcommand(p, args, sub, dest: str = "what") -> None:
    """argparse's own error for a missing subcommand names the internal dest ("the following arguments are
    required: what"); this one names the subcommands. `sub`: the parser's add_subparsers() action, added
    with required=False so that this check is the one that speaks."""
    if getattr(args, dest) is None:
        p.error(f"choose one of: {', '.join(sub.choices)}")  # (Parser.error adds where --help is)


def refuse_empty_paths(p: Parser, args: argparse.Namespace, flags: tuple[str, ...], default: bool = True) -> None:
    """A path option given as "" (`--resume "$RUN"` with $RUN unset) is refused: it read as not given, so
    `train --resume ""` started a new run instead of resuming one, and `--run-dir ""` trained into a default
    directory the caller never looks in. `default`: the flag has one to name (else it is required)."""
    for flag in flags:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if isinstance(value, str) and not value.strip():
            p.error(f"{flag} is empty; pass a directory" + (f", or drop {flag} for its default" if default else ""))
