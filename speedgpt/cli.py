"""Command line: `speedgpt train | data | report | ...`.

Each subcommand parses its own arguments and imports its heavy modules only when it runs, so
`speedgpt --help` is instant.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

TRAIN_EPILOG = """\
overrides: any config key as --section.key=value, e.g. --model.depth=8 --optim.muon_lr=0.03
           --train.steps=500 --data.train_files=data/mycorpus  (see a run's config.toml for all keys)
examples:
  speedgpt train                                   # default: tiny-cpu on CPU, speedrun-124m on a GPU
  speedgpt train --preset speedrun-124m --train.steps=300
  speedgpt train --config runs/x/config.toml       # reproduce a run
  speedgpt train --resume runs/x                   # continue a run from its latest checkpoint
"""


def cmd_train(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="speedgpt train", description="Train a GPT model.", epilog=TRAIN_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", help="preset name (default: tiny-cpu without a GPU, speedrun-124m with one)")
    p.add_argument("--config", help="a config.toml, e.g. one saved in a run directory")
    p.add_argument("--resume", metavar="RUN_DIR", help="resume RUN_DIR from its latest checkpoint")
    p.add_argument("--run-dir", help="where to write the run (default runs/<name>-<time>)")
    p.add_argument("--list-presets", action="store_true")
    args, overrides = p.parse_known_args(argv)

    from .config import ConfigError, preset_names, resolve

    if args.list_presets:
        print("\n".join(preset_names()))
        return 0
    bad = [o for o in overrides if not o.startswith("--") or "." not in o.split("=", 1)[0]]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)} (config overrides look like --model.depth=8)")
    # "--key value" is accepted too: fold it into "--key=value".
    folded: list[str] = []
    for item in overrides:
        if folded and "=" not in folded[-1] and not item.startswith("--"):
            folded[-1] += "=" + item
        else:
            folded.append(item)
    run_dir = args.run_dir
    config_file = args.config
    if args.resume:
        run_dir = args.resume
        config_file = config_file or str(Path(args.resume) / "config.toml")
    preset = args.preset
    if not preset and not config_file:
        import torch

        preset = "speedrun-124m" if torch.cuda.is_available() else "tiny-cpu"
    try:
        cfg = resolve(preset, config_file, folded)
    except ConfigError as e:
        print(f"speedgpt train: config error: {e}", file=sys.stderr)
        return 2

    from .train.loop import train

    try:
        train(cfg, run_dir=run_dir, resume=bool(args.resume))
    except ConfigError as e:
        print(f"speedgpt train: config error: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_report(argv: list[str]) -> int:
    from .report import main as report_main

    return report_main(argv) or 0


def cmd_bench(argv: list[str]) -> int:
    from .bench import main as bench_main

    return bench_main(argv)


COMMANDS = {
    "train": (cmd_train, "train a model (default job: tiny-cpu on CPU, speedrun-124m on a GPU)"),
    "bench": (cmd_bench, "measure tokens/s, MFU, memory and compile time of a preset (A/B with --ab)"),
    "report": (cmd_report, "plot and compare runs: RUN_DIR [RUN_DIR ...]"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["train"]
    if argv[0] in ("-h", "--help"):
        print("usage: speedgpt COMMAND [options]\n\ncommands:")
        for name, (_, help_) in COMMANDS.items():
            print(f"  {name:<9} {help_}")
        print("\n`speedgpt COMMAND --help` for a command's options; `speedgpt` alone runs `speedgpt train`.")
        return 0
    if argv[0] in ("-V", "--version"):
        from . import __version__

        print(__version__)
        return 0
    name = argv[0]
    if name not in COMMANDS:
        print(f"speedgpt: unknown command '{name}'; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return COMMANDS[name][0](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
