"""The block size and prompts the memory-manager tests step with."""

from __future__ import annotations

BS = 4
A = tuple(range(100, 110))  # 10 tokens: 2 full blocks + 2
B = tuple(range(200, 212))  # 12 tokens: 3 full blocks
C = tuple(range(300, 312))  # 12 tokens: 3 full blocks
