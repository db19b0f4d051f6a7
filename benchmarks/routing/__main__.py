"""`make bench-routing`: python -m benchmarks.routing."""

from __future__ import annotations

import sys

from benchmarks.routing.main import main

sys.exit(main())
