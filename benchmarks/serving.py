"""`make bench-serving`: the online serving benchmark (benchmarks/online/), run as a module.

python -m benchmarks.serving --help
"""

from __future__ import annotations

from benchmarks.online.main import main

if __name__ == "__main__":
    main()
