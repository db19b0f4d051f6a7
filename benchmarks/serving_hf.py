"""Launch `transformers serve` on the CPU without the `accelerate` package.

    python -m benchmarks.serving_hf [transformers serve options] MODEL_DIR

transformers' server always loads its model with `device_map=<--device>`, and
`from_pretrained` refuses any device_map unless `accelerate` is installed, even "cpu". A
device_map of "cpu" (or none) means the default placement anyway, so this launcher drops it
and then runs the unmodified `transformers serve` command line.
"""

from __future__ import annotations

import sys
from typing import Any


def _patch_cpu_device_map() -> None:
    import transformers.modeling_utils as modeling_utils

    original = modeling_utils.check_and_set_device_map

    def check_and_set_device_map(device_map: Any) -> Any:
        if device_map in (None, "cpu"):
            return None
        return original(device_map)

    modeling_utils.check_and_set_device_map = check_and_set_device_map


def main() -> None:
    _patch_cpu_device_map()
    from transformers.cli.transformers import main as transformers_main

    sys.argv = ["transformers", "serve", *sys.argv[1:]]
    transformers_main()


if __name__ == "__main__":
    main()
