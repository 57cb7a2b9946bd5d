"""A fixed-capacity package's runner replayed as CUDA graphs, one per atom count.

An AOTInductor package launches every kernel from its C++ wrapper (about 250 launches for a
published model), and a package whose sizes depend on the data also synchronises with the
host to size its neighbour list. A fixed-capacity package (``flashcart-export --fixed-capacity``)
does neither: all its sizes follow from the atom count, so one call can be captured as a CUDA
graph and replayed, as the Predictor's ``reduce-overhead`` mode replays its compiled calls.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict

import torch

__all__ = ["GraphedRunner"]


class GraphedRunner:
    """``__call__(positions [N, 3], numbers [N], cell [3, 3], pbc [3]) -> (energy [], forces [N, 3])``
    of ``runner`` (a fixed-capacity CUDA package loaded with ``run_single_threaded=True``: the
    default runner's event query fails on the first run after a capture), through CUDA graphs.

    The first call with ``N`` atoms runs the package ``warmup`` times on a side stream and
    captures one call between static input and output tensors; later calls with ``N`` atoms copy
    their inputs in and replay it. At most ``max_graphs`` atom counts are kept (the least
    recently used is dropped). Results are fresh tensors (copies of the graph's outputs).

    ``strict=False``: a capture that fails warns once and every call runs the package directly.
    """

    def __init__(self, runner, max_graphs: int = 4, warmup: int = 2, strict: bool = False):
        if max_graphs < 1:
            raise ValueError(f"max_graphs must be at least 1, got {max_graphs}")
        self.runner = runner
        self.max_graphs = int(max_graphs)
        self.warmup = int(warmup)
        self.strict = strict
        self.captures = 0
        self.failed: str | None = None  # why capturing failed (then calls run the package directly)
        self._graphs: OrderedDict[int, tuple] = OrderedDict()

    def __call__(self, positions, numbers, cell, pbc):
        if self.failed is not None:
            return self.runner(positions, numbers, cell, pbc)
        n = int(positions.shape[0])
        entry = self._graphs.get(n)
        if entry is None:
            try:
                entry = self._capture(positions, numbers, cell, pbc)
            except RuntimeError as err:
                if self.strict:
                    raise RuntimeError(f"capturing the package in a CUDA graph failed: {err}") from err
                self.failed = str(err)
                warnings.warn(f"capturing the package in a CUDA graph failed ({err}); running it without one", stacklevel=2)
                return self.runner(positions, numbers, cell, pbc)
            self._graphs[n] = entry
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(n)
        inputs, outputs, graph = entry
        for static, value in zip(inputs, (positions, numbers, cell, pbc)):
            static.copy_(value)
        graph.replay()
        return outputs[0].clone(), outputs[1].clone()

    def _capture(self, *args):
        inputs = tuple(t.clone() for t in args)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.runner(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # "relaxed": the default (multi-threaded) runner queries the CUDA event of its previous
        # run (cudaEventQuery) to pick a free model instance, which the default "global" capture
        # mode forbids on any thread ("operation not permitted when stream is capturing", H200,
        # torch 2.11); the query touches no stream, so the captured work is the same. The
        # loader passes the single-threaded runner, which makes no such query (after a capture
        # the query fails; see ExportedPotential._graph_runner); relaxed mode stays, as verified.
        with torch.cuda.graph(graph, capture_error_mode="relaxed"):
            outputs = self.runner(*inputs)
        self.captures += 1
        return inputs, tuple(outputs), graph
