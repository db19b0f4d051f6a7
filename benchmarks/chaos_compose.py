"""`make chaos-compose`: faults across the compose stack's containers (benchmarks/chaos/compose.py).

python -m benchmarks.chaos_compose --help
"""

from __future__ import annotations

import sys

from benchmarks.chaos.compose import main

if __name__ == "__main__":
    sys.exit(main())
