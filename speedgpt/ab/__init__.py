"""`speedgpt ab`: a paired A/B of two configurations over several seeds, judged on validation loss
and on training time to a target loss.

Seed s of arm A and of arm B get the same train.seed (same init where the architecture is the
same, same data order). Runs go in the order A B A B ...; with several GPUs one wave runs one run
per GPU at once (A and B of a seed side by side, GPUs swapped every seed so a faster GPU favours
neither arm). Each run is `python -m speedgpt train ... --run-dir OUT/<arm>-seed<s>` with its output
in OUT/<arm>-seed<s>/train.log. A run counts as finished when its metrics.jsonl holds its final
validation (after its configured steps, or where train.time_budget_s stopped it), so an
interrupted `ab` resumes where it stopped; a half-run is resumed from its checkpoint or rerun from
scratch. Results: a table, OUT/summary.json, OUT/ab.png and a markdown row for docs/experiments.md
(which explains the statistics).

One module per job:
  plan.py      the arms, the paired runs and their launch order (waves over devices)
  run.py       running them as `speedgpt train` subprocesses; what is finished, failed or resumable
  summary.py   per-run results, time to target, the paired statistics and the printed table
  stats.py     the statistics themselves (scipy)
  notebook.py  the markdown row for docs/experiments.md;  plot.py  OUT/ab.png
  cli.py       the command line (`speedgpt ab`)
"""
