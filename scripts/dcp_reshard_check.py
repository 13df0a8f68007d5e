"""A DCP checkpoint written on W ranks resumed on W/2 and 1, losses side by side (docs/distributed.md):
`python scripts/dcp_reshard_check.py --nproc 4 --backend nccl --preset dense-1b --steps 10 --more 5 ...`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from speedgpt.tools.reshard_check import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
