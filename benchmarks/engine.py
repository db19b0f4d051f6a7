"""`make bench-engine`: the offline engine benchmark (benchmarks/offline/), run as a module.

python -m benchmarks.engine --help
"""

from __future__ import annotations

from benchmarks.offline.main import main

if __name__ == "__main__":
    main()
