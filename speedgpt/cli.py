"""Command line: `speedgpt train | data | report | ...`.

Each subcommand (speedgpt/commands/, one module per group) parses its own arguments and imports
its heavy modules only when it runs, so `speedgpt --help` is instant.
"""

from __future__ import annotations

import os
import sys
import warnings

from .commands.chat import cmd_chat
from .commands.data import cmd_data
from .commands.runs import cmd_config, cmd_eval, cmd_export, cmd_report, cmd_sample
from .commands.sft import cmd_sft
from .commands.train import cmd_train


def cmd_sweep(argv: list[str]) -> int:
    from .sweep import main as sweep_main

    return sweep_main(argv)


def cmd_bench(argv: list[str]) -> int:
    from .bench import main as bench_main

    return bench_main(argv)


def cmd_tokenizer(argv: list[str]) -> int:
    from .tokenizer.cli import main as tokenizer_main

    return tokenizer_main(argv)


def cmd_ab(argv: list[str]) -> int:
    from .ab.cli import main as ab_main

    return ab_main(argv)


def cmd_help(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):  # `help --help`, and `help help` (which asks for this): the list;
        return _main(["--help"])                 # they said "unknown command '--help'", exit 2
    if argv[0] not in COMMANDS:
        print(f"speedgpt help: unknown command '{argv[0]}'; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return _main([*argv, "--help"])  # e.g. `speedgpt help data tokenize`


def _error_line(e: BaseException) -> str:
    """The first line of an error's message; unexpected error types keep their name."""
    lines = [line for line in str(e).splitlines() if line.strip()]
    text = lines[0] if lines else type(e).__name__
    if not isinstance(e, (ValueError, OSError, RuntimeError)):
        text = f"{type(e).__name__}: {text} (SPEEDGPT_DEBUG=1 shows the traceback)"
    return text


COMMANDS = {
    "train": (cmd_train, "train a model (default job: tiny-cpu on CPU, speedrun-latest on a GPU)"),
    "data": (cmd_data, "prepare shards: tokenize FILES | local-python | fineweb"),
    "tokenizer": (cmd_tokenizer, "your own BPE tokenizer: train DATA --vocab-size N --out DIR | eval DIR DATA"),
    "sft": (cmd_sft, "fine-tune a base run on conversations (assistant tokens only): BASE_RUN [--data FILE ...]"),
    "chat": (cmd_chat, "talk to an SFT model: RUN in the terminal, --prompt TEXT once, --serve a local web page"),
    "bench": (cmd_bench, "measure tokens/s, MFU, memory and compile time of a preset (A/B with --ab)"),
    "report": (cmd_report, "plot and compare runs: RUN_DIR [RUN_DIR ...]"),
    "eval": (cmd_eval, "val loss, bits per byte, HellaSwag of a run: RUN_DIR [--data ...] [--hellaswag ...]"),
    "sample": (cmd_sample, "continue prompts with a trained model: RUN_DIR --prompt TEXT [--prompt ...]"),
    "ab": (cmd_ab, "paired A/B over seeds: --preset P --a \"OVERRIDES\" --b \"OVERRIDES\" --seeds N [--target-loss L]"),
    "sweep": (cmd_sweep, "depths x budgets, then the compute-optimal frontier: --out DIR --depths 4,6 --flops 1e15,3e15"),
    "export": (cmd_export, "weights as model.safetensors + config.json: RUN_DIR [--out DIR] [--dtype bf16|fp32] "
                           "[--format speedgpt|hf]"),
    "config": (cmd_config, "every config key with its value and a description: [--preset P] [--config FILE]"),
    "help": (cmd_help, "this list, or a command's options: help [COMMAND]"),
}


LOADS_TORCH = {"train", "bench", "eval", "sample", "export", "sft", "chat"}

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_python_formatwarning = warnings.formatwarning


def _warnings_as_lines(name: str) -> None:
    """speedgpt's own warnings (a skipped unreadable metrics line, a bad shard skipped) speak to the user: one line
    naming the command, not Python's "FILE:LINE: UserWarning: ..." and the source line under it. Others' (torch's)
    keep Python's form, whose file and line say where to look."""
    def one_line(message, category, filename, lineno, line=None):
        if category is UserWarning and os.path.abspath(filename).startswith(_PACKAGE):
            return f"speedgpt {name}: warning: {message}\n"
        return _python_formatwarning(message, category, filename, lineno, line)

    warnings.formatwarning = one_line


def main(argv: list[str] | None = None) -> int:
    try:
        status = _main(argv)
        sys.stdout.flush()  # a reader that went away shows here, not in Python's own flush at exit
        return status
    except BrokenPipeError:
        # The reader stopped reading (`speedgpt config | head`), having what it wanted: end quietly,
        # as command-line tools do. stdout goes to /dev/null so the flush at exit finds no pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["train"]
    if argv[0] in ("-h", "--help"):
        print("usage: speedgpt COMMAND [options]\n\ncommands:")
        for name, (_, help_) in COMMANDS.items():
            print(f"  {name:<9} {help_}")
        print("\n`speedgpt help COMMAND` for a command's options; `speedgpt` alone runs `speedgpt train`.")
        return 0
    if argv[0] in ("-V", "--version"):
        from . import __version__

        print(__version__)
        return 0
    name = argv[0]
    if name not in COMMANDS:
        print(f"speedgpt: unknown command '{name}'; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    # Last resort for what a command does not handle itself: one line and a non-zero status (2 for bad
    # input, 1 for anything else), never a traceback (SPEEDGPT_DEBUG=1 shows it). Ctrl-C: "interrupted" and 130, the shell's code for SIGINT.
    _warnings_as_lines(name)
    try:
        if name in LOADS_TORCH and not {"-h", "--help"} & set(argv):
            from .interrupt import holding_ctrl_c

            holding_ctrl_c()  # torch's import can swallow a Ctrl-C (interrupt.py): load it with the signal held
        return COMMANDS[name][0](argv[1:])
    except KeyboardInterrupt:
        if os.environ.get("SPEEDGPT_DEBUG"):
            raise
        print(f"\nspeedgpt {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise  # main() ends quietly
    except (FileNotFoundError, ValueError) as e:
        # Bad input (a ConfigError is a ValueError): status 2, as the commands that catch their own give.
        if os.environ.get("SPEEDGPT_DEBUG"):
            raise
        print(f"speedgpt {name}: error: {_error_line(e)}", file=sys.stderr)
        return 2
    except Exception as e:
        if os.environ.get("SPEEDGPT_DEBUG"):
            raise
        print(f"speedgpt {name}: error: {_error_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
