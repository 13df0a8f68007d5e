"""Non-English text that ships on most Linux machines: the translated messages of the programs'
gettext catalogs (/usr/share/locale/LANG/LC_MESSAGES/*.mo), one JSONL document per catalog.

    python scripts/locale_text.py zh_CN --out data/zh.jsonl     # Chinese (also ja, ko, ru, de, ...)

A demo corpus for `speedgpt tokenizer train` and a tiny model (README, docs/tokenizer.md): a few MB of
UI strings, not prose. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import gettext
import json
import sys
from pathlib import Path


def catalog_texts(lang: str, root: Path = Path("/usr/share/locale")) -> list[dict]:
    """[{"text", "catalog"}] for every readable catalog of `lang`, in file-name order."""
    docs = []
    for path in sorted((root / lang / "LC_MESSAGES").glob("*.mo")):
        try:
            with open(path, "rb") as f:
                messages = gettext.GNUTranslations(f)._catalog  # msgid -> translation (plural keys are tuples)
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # a damaged or non-UTF-8 catalog: not text we can use
        text = "\n".join(v for k, v in messages.items() if k and isinstance(v, str) and v.strip())
        if text:
            docs.append({"text": text, "catalog": path.name})
    return docs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("lang", help="a folder name under /usr/share/locale, e.g. zh_CN, ja, ru")
    p.add_argument("--out", required=True, help="the JSONL file to write")
    p.add_argument("--root", default="/usr/share/locale", help="where the catalogs are (default /usr/share/locale)")
    args = p.parse_args(argv)
    docs = catalog_texts(args.lang, Path(args.root))
    if not docs:
        print(f"locale_text: no readable catalogs in {args.root}/{args.lang}/LC_MESSAGES; pick a language listed "
              f"in {args.root}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    print(f"{len(docs)} catalogs, {sum(len(d['text']) for d in docs):,} characters -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
