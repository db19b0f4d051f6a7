"""python -m benchmarks.routing_sim."""

from __future__ import annotations

import sys

from benchmarks.routing_sim.main import main

sys.exit(main())
