"""Cold time to derive and emit every generated source for a rank limit.

Each measurement runs in a fresh process with an empty cache directory, so it includes
the Python/torch import, the sympy derivation, emission and the atomic write.

    python benchmarks/codegen.py --l-max 3 4
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

SNIPPET = """
import time
t0 = time.perf_counter()
from flashcart.cartesian._backend import torch_ops
import flashcart.cartesian._backend as b
b.torch_ops()
t1 = time.perf_counter()
try:
    from flashcart.cartesian._triton.source import triton_module
    triton_module()
except ImportError:
    pass
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--l-max", type=int, nargs="+", default=[3, 4])
    args = parser.parse_args()
    print("l_max  torch_source_s  triton_source_s  process_total_s")
    for l_max in args.l_max:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "FLASHCART_CACHE_DIR": cache, "FLASHCART_KERNEL_L_MAX": str(l_max)}
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", SNIPPET], env=env, capture_output=True, text=True, check=True)
            total = time.perf_counter() - t0
            torch_s, triton_s = out.stdout.split()
            print(f"{l_max:5d}  {float(torch_s):14.3f}  {float(triton_s):15.3f}  {total:15.3f}")


if __name__ == "__main__":
    main()
