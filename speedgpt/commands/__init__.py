"""The subcommands of `speedgpt` (cli.py dispatches to them), one module per group: train.py, data.py,
runs.py (report, eval, sample, export, config). Each imports its heavy modules only when it runs."""
