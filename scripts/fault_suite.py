"""Fault-injection suite (docs/reliability.md): `python scripts/fault_suite.py --trials 100 --faults kill9`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from speedgpt.tools.fault_suite import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
