"""``flashcart-demo``: a short tour of the Cartesian tensor algebra on the CPU."""

from __future__ import annotations

import argparse
import time

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashcart-demo", description=__doc__)
    parser.add_argument("--l-max", type=int, default=3, help="highest rank (default 3)")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    from flashcart.cartesian import DirectionExpansion, EquivariantLinear, TensorProduct, rotate
    from flashcart.cartesian._backend import torch_ops
    from flashcart.testing import random_rotation

    torch_ops()
    print(f"generated sources ready in {time.perf_counter() - t0:.2f} s (cached after the first run)")
    torch.manual_seed(0)
    dtype = torch.float64
    r = torch.randn(6, 3, dtype=dtype)
    expansion = DirectionExpansion(args.l_max)
    attrs = expansion(r)
    print(f"DirectionExpansion(l_max={args.l_max}): {tuple(r.shape)} -> {tuple(attrs.shape)}")
    tp = TensorProduct(args.l_max, args.l_max, args.l_max, 1, 1, reduce_paths=True)
    w = torch.randn(6, tp.weight_numel, dtype=dtype)
    out = tp(attrs, attrs, w)
    print(f"TensorProduct: {tp.n_paths} paths, per output rank {tp.n_paths_per_rank}, output {tuple(out.shape)}")
    lin = EquivariantLinear(args.l_max, args.l_max, 1, 4).to(dtype)
    y = lin(out)
    R = random_rotation(improper=True)
    y_rot = lin(tp(expansion(r @ R.T), expansion(r @ R.T), w))
    err = (y_rot - rotate(y, R, args.l_max)).abs().max().item()
    print(f"EquivariantLinear -> {tuple(y.shape)}; equivariance error under an improper rotation: {err:.2e}")
    return 0 if err < 1e-10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
