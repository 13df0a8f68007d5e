"""Command-line helpers shared by the subcommands."""

from __future__ import annotations


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
