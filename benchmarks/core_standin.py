"""A stand-in CORE bundle with the real bundle's shape, for timing `speedgpt eval --core` offline.

The real bundle (DCLM's 22 tasks) cannot be downloaded on machines without internet. What the
eval's time depends on is the number of examples per task, the format, the number of choices, the
shots and the text lengths, not the words. This writes a bundle in the real layout (core.yaml,
eval_meta_data.csv, eval_data/*.jsonl) whose tasks have the public dataset splits' sizes and
typical lengths (approximate: the counts are the datasets' published split sizes, the lengths
rough word counts of their items), filled with words drawn from a text file. Its score means
nothing; its time is what `eval --core` costs on the real bundle, to within the length guesses.

    python benchmarks/core_standin.py --out /tmp/core_standin [--words-from FILE] [--scale 1.0]
    speedgpt eval runs/x --core --core-bundle /tmp/core_standin
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import re
import sys
from pathlib import Path

# label: (format, examples, choices or context options, shots, random baseline %, query words, answer words)
# Query words include any passage the item carries (SQuAD, CoQA, BoolQ); LM answers are short.
TASKS = {
    "hellaswag_zeroshot": ("multiple_choice", 10042, 4, 0, 25, 45, 20),
    "jeopardy": ("language_modeling", 2117, 1, 10, 0, 20, 2),
    "bigbench_qa_wikidata": ("language_modeling", 20321, 1, 10, 0, 8, 2),
    "arc_easy": ("multiple_choice", 2376, 4, 10, 25, 25, 4),
    "arc_challenge": ("multiple_choice", 1172, 4, 10, 25, 28, 5),
    "copa": ("multiple_choice", 100, 2, 0, 50, 10, 7),
    "commonsense_qa": ("multiple_choice", 1221, 5, 10, 20, 14, 2),
    "piqa": ("multiple_choice", 1838, 2, 10, 50, 9, 20),
    "openbook_qa": ("multiple_choice", 500, 4, 0, 25, 12, 4),
    "lambada_openai": ("language_modeling", 5153, 1, 0, 0, 70, 1),
    "hellaswag": ("multiple_choice", 10042, 4, 10, 25, 45, 20),
    "winograd": ("schema", 273, 2, 0, 50, 12, 8),
    "winogrande": ("schema", 1267, 2, 0, 50, 14, 8),
    "bigbench_dyck_languages": ("language_modeling", 1000, 1, 10, 0, 30, 4),
    "agi_eval_lsat_ar": ("multiple_choice", 230, 5, 3, 20, 200, 15),
    "bigbench_cs_algorithms": ("language_modeling", 1320, 1, 10, 0, 25, 2),
    "bigbench_operators": ("language_modeling", 210, 1, 10, 0, 15, 2),
    "bigbench_repeat_copy_logic": ("language_modeling", 32, 1, 10, 0, 20, 15),
    "squad": ("language_modeling", 10570, 1, 10, 0, 130, 3),
    "coqa": ("language_modeling", 7983, 1, 0, 0, 280, 3),
    "boolq": ("multiple_choice", 3270, 2, 10, 62, 110, 1),
    "bigbench_language_identification": ("multiple_choice", 10000, 11, 10, 25, 20, 2),
}


def write_bundle(out: Path, words: list[str], scale: float = 1.0, seed: int = 0) -> int:
    """Write the stand-in bundle to `out`; returns the number of examples written."""
    rng = random.Random(seed)

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(max(1, n)))

    (out / "eval_data").mkdir(parents=True, exist_ok=True)
    yaml_lines, meta_rows, total = ["icl_tasks:"], [], 0
    for label, (kind, n, options, shots, baseline, q_words, a_words) in TASKS.items():
        n = max(shots + 1, round(n * scale))
        rows = []
        for _ in range(n):
            if kind == "multiple_choice":
                rows.append({"query": text(q_words), "choices": [text(a_words) for _ in range(options)],
                             "gold": rng.randrange(options)})
            elif kind == "schema":
                rows.append({"context_options": [text(q_words) for _ in range(options)],
                             "continuation": text(a_words), "gold": rng.randrange(options)})
            else:
                rows.append({"context": text(q_words), "continuation": text(a_words)})
        (out / "eval_data" / f"{label}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        yaml_lines += [f"- label: {label}", f"  dataset_uri: {label}.jsonl", f"  num_fewshot: [{shots}]",
                       f"  icl_task_type: {kind}", "  continuation_delimiter: ' '"]
        meta_rows.append({"Eval Task": label, "Random baseline": baseline})
        total += n
    (out / "core.yaml").write_text("\n".join(yaml_lines) + "\n")
    with open(out / "eval_meta_data.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["Eval Task", "Random baseline"])
        w.writeheader()
        w.writerows(meta_rows)
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory to write the bundle into")
    p.add_argument("--words-from", default=None,
                   help="a text file whose words fill the items (default: this script's own source)")
    p.add_argument("--scale", type=float, default=1.0, help="fraction of each task's examples (1.0: the real sizes)")
    args = p.parse_args(argv)
    source = Path(args.words_from or __file__)
    if not source.is_file():
        p.error(f"--words-from {source}: not a file; pass any text file")
    if not 0 < args.scale <= 1:
        p.error(f"--scale {args.scale}: must be in (0, 1]")
    words = re.findall(r"[A-Za-z]+", source.read_text(encoding="utf-8", errors="replace"))
    if len(words) < 50:
        p.error(f"--words-from {source}: fewer than 50 words; pass a larger text file")
    from speedgpt.outdir import OutDirError, make_out_dir

    out = Path(args.out)
    if out.is_dir() and any(out.iterdir()):
        p.error(f"--out {out}: not empty; pass a new directory")
    try:
        make_out_dir(out)
    except OutDirError as e:
        p.error(str(e))
    total = write_bundle(out, words, args.scale)
    print(f"wrote a stand-in CORE bundle of {len(TASKS)} tasks, {total:,} examples, to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
