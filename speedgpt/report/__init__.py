"""Run reports: curves and a summary table for one run or several overlaid.

``write_report([run_dir], out_dir)`` writes ``report.png`` and a self-contained ``report.html``.
With several runs the first is the baseline A of an A/B table (``compare_runs``): each run's val
loss at equal training time and at equal tokens, its delta to A, the final numbers, and the config
keys that differ from A's; printed with rich, as GitHub markdown and in the HTML.

By job: runs.py reads run directories, summary.py and compare.py compute the tables, tables.py
formats and prints them, plot.py draws the figure, page.py writes the files; `speedgpt report`
(cli.py) parses the command line. Importing this package loads neither matplotlib nor rich nor torch.
"""

from .compare import compare_runs, comparison_markdown, config_diff, format_comparison, interpolate, print_comparison
from .page import report_runs, write_report
from .plot import plot_runs
from .runs import RunData, load_run, load_runs
from .summary import format_rows, print_summary, summarize, summary_table
from .tables import fmt_count, fmt_duration, transpose_rows

__all__ = ["RunData", "compare_runs", "comparison_markdown", "config_diff", "fmt_count", "fmt_duration",
           "format_comparison", "format_rows", "interpolate", "load_run", "load_runs", "plot_runs", "print_comparison",
           "print_summary", "report_runs", "summarize", "summary_table", "transpose_rows", "write_report"]
