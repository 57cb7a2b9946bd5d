"""How accurately a table could stand in for the radial MLPs at inference (issue 14, a study).

Each interaction's path weights are a function of the edge length alone: ``w(d) = MLP(basis(d) *
env(d))``, ``R -> R^W``. The MLP is 27 % of the compiled force call's kernel time. By the H200
kernel profile of 2026-12-05 that is about 0.62 ms of 2.29: cuBLAS FP32 products at 23
TFLOP/s, then SiLU and its derivative. With frozen parameters, ``w`` could be tabulated once on
a grid of ``K`` intervals over ``[0, r_max]``: values and derivatives at the knots, cubic Hermite
between them. Per edge pair that is two table rows read instead of three layers of products.
The interpolant is C1, so forces stay its exact derivative (energy is conserved). The error is
``O(h^4)`` in the values and ``O(h^3)`` in the derivatives.

This script measures that error with :mod:`flashcart.nn.radial_table`'s functions
(``FlashCartPotential.set_radial_tables`` builds the same tables into a model). For each interaction of a
published model (float64 reference, random initialisation as ``FlashCartPotential.from_config``
makes it, and the same MLPs with weights scaled up to mimic sharper trained functions) it
reports, per table size:

* ``max|w_table - w| / max|w|`` and ``max|w'_table - w'| / max|w'|`` over ``--samples`` random
  lengths in ``[0, r_max]``: knot values and slopes rounded to float32 (``knots f32``), the
  per-interval cubics rounded to float32 and evaluated in float64 (``cubics f32``) or, as a
  float32 call does, in float32 (``cubics f32 eval``);
* the same for the float32 evaluation of the MLP itself (what every call computes today): the
  noise floor a table must stay under.

Run: ``.venv/bin/python benchmarks/radial_table.py`` (about a minute on the CPU);
``--model``, ``--intervals``, ``--samples``, ``--scales``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.kernel_profile import MODELS  # noqa: E402
from flashcart.config import load_config  # noqa: E402
from flashcart.model import FlashCartPotential  # noqa: E402
from flashcart.nn.radial_table import cubic_table, table_weights  # noqa: E402


def radial_weights(interaction, basis, envelope, d: torch.Tensor) -> torch.Tensor:
    """``[len(d), W]``: the interaction's path weights at lengths ``d`` (Å), as the model computes them."""
    return interaction.radial(basis(d) * envelope(d)[:, None])


def values_and_slopes(fn, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn(d)`` and its derivative ``d fn / d d`` (one column per output, by forward-mode AD)."""
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(d, torch.ones_like(d))
        out = torch.autograd.forward_ad.unpack_dual(fn(dual))
    return out.primal, out.tangent


def hermite(values: torch.Tensor, slopes: torch.Tensor, h: float, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cubic Hermite interpolant of knots ``k h`` (``values``/``slopes`` ``[K+1, W]``) at ``d``,
    and its derivative in ``d``."""
    x = d / h
    k = x.floor().clamp(0, values.shape[0] - 2).long()
    s = (x - k)[:, None]
    y0, y1, m0, m1 = values[k], values[k + 1], slopes[k] * h, slopes[k + 1] * h
    s2, s3 = s * s, s * s * s
    w = (2 * s3 - 3 * s2 + 1) * y0 + (s3 - 2 * s2 + s) * m0 + (-2 * s3 + 3 * s2) * y1 + (s3 - s2) * m1
    dw = ((6 * s2 - 6 * s) * y0 + (3 * s2 - 4 * s + 1) * m0 + (-6 * s2 + 6 * s) * y1 + (3 * s2 - 2 * s) * m1) / h
    return w, dw


def report(row: str, err: torch.Tensor, slope_err: torch.Tensor, w_max: torch.Tensor, slope_max: torch.Tensor) -> None:
    """One table row: the largest value and slope errors relative to the largest ``|w|`` and ``|w'|``."""
    print(f"{row} {float(err.abs().max() / w_max):>12.2e} {float(slope_err.abs().max() / slope_max):>12.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="i2c3f20l2r", choices=list(MODELS))
    parser.add_argument("--r-max", type=float, default=6.0)
    parser.add_argument("--intervals", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0, 3.0], help="the MLP weights times these")
    args = parser.parse_args()

    torch.manual_seed(0)
    cfg = load_config(overrides=[f"r_max={args.r_max}", *MODELS[args.model]])
    model = FlashCartPotential.from_config(cfg, ["C"]).double()
    basis, envelope, r_max = model.basis, model.envelope, args.r_max
    print(
        f"[setup] {args.model}, r_max {r_max} Å, radial basis {basis.n} ({basis.mapping}, r_min {basis.r_min}), "
        f"envelope order {envelope.p}; {args.samples} random lengths; errors relative to the largest |w| and |w'|"
    )
    d = torch.rand(args.samples, dtype=torch.float64) * r_max
    print(f"{'interaction':>11} {'scale':>5} {'W':>4} {'table':>22} {'value error':>12} {'slope error':>12}")
    for scale in args.scales:
        for i, interaction in enumerate(model.interactions):
            mlp = interaction.radial
            saved = [layer.weight.detach().clone() for layer in mlp.layers]
            with torch.no_grad():
                for layer in mlp.layers:
                    layer.weight.mul_(scale)
            try:
                with torch.no_grad():
                    fn = lambda x: radial_weights(interaction, basis, envelope, x)  # noqa: E731
                    w, dw = values_and_slopes(fn, d)
                    w_max, dw_max = w.abs().max(), dw.abs().max()
                    n_out = w.shape[1]
                    # today's float32 evaluation, and its derivative by float32 forward-mode AD
                    w32, dw32 = values_and_slopes(lambda x: radial_weights(interaction.float(), basis, envelope, x), d.float())
                    interaction.double()
                    row = f"{i:>11} {scale:>5g} {n_out:>4}"
                    report(f"{row} {'float32 MLP':>22}", w32.double() - w, dw32.double() - dw, w_max, dw_max)
                    for k in args.intervals:
                        h = r_max / k
                        knots = torch.arange(k + 1, dtype=torch.float64) * h
                        v, m = values_and_slopes(fn, knots)
                        cubics = cubic_table(fn, r_max, k)
                        tables = {
                            "knots f32": hermite(v.float().double(), m.float().double(), h, d),
                            "cubics f32": values_and_slopes(lambda x: table_weights(cubics.float().double(), r_max, x), d),
                            "cubics f32 eval": values_and_slopes(lambda x: table_weights(cubics.float(), r_max, x), d.float()),
                        }
                        for name, (wt, dwt) in tables.items():
                            report(f"{row} {f'{k} {name}':>22}", wt.double() - w, dwt.double() - dw, w_max, dw_max)
            finally:
                with torch.no_grad():
                    for layer, weight in zip(mlp.layers, saved):
                        layer.weight.copy_(weight)


if __name__ == "__main__":
    main()
