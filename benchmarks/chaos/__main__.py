"""`make chaos`: python -m benchmarks.chaos."""

from __future__ import annotations

import sys

from benchmarks.chaos.cli import main

sys.exit(main())
