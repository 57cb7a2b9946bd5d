"""Per-call cost of Predictor._layout's cache hit (the check every MD step and profiler call makes), CPU, one thread.

python benchmarks/layout_cache_hit.py
"""

import statistics, sys, time
import torch

sys.path.insert(0, ".")
from tests.model.conftest import as_batch, crystal
from flashcart.model.potential import FlashCartPotential
from flashcart.model.predictor import Predictor
from flashcart.testing import TINY_MODEL

torch.set_num_threads(1)
m = FlashCartPotential(["H", "C", "O", "Cu"], avg_neighbors=5.0, use_triton=False, **TINY_MODEL).double()
b = as_batch(m, [crystal()])
p = Predictor(m)
p(b)
n = b.receivers.shape[0]
p._layout(b, n)
rounds = []
for _ in range(21):
    t0 = time.perf_counter()
    for _ in range(20000):
        p._layout(b, n)
    rounds.append((time.perf_counter() - t0) / 20000 * 1e6)
print(f"_layout hit: median {statistics.median(rounds):.2f} us/call (min {min(rounds):.2f})")
