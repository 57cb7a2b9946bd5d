"""Testing helpers shared by FlashCart's own tests and by users' extensions.

Each helper raises ``AssertionError`` with the worst deviation it found.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .cartesian import rotate

__all__ = ["random_rotation", "assert_equivariant", "assert_close", "assert_forces_are_gradients", "TOLERANCES", "TINY_MODEL"]

# A small architecture for fast tests (all ranks and layer types present).
TINY_MODEL = dict(
    n_hidden_feats=4,
    l_max_hidden_feats=2,
    l_max_edge_attrs=2,
    n_radial=4,
    n_interactions=2,
    correlation=3,
    hidden_radial=[8],
    hidden_readout=[8],
    r_max=4.0,
)

TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-4}


def random_rotation(improper: bool = False, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None) -> torch.Tensor:
    """A uniformly random ``[3, 3]`` rotation (``det = -1`` when ``improper``)."""
    q, r = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64, generator=generator))
    q = q * torch.sign(torch.diagonal(r))
    if torch.det(q) < 0:
        q[:, 0] = -q[:, 0]
    if improper:
        q = -q
    return q.to(dtype)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float | None = None, what: str = "") -> None:
    """Max-abs deviation relative to ``max(1, max|expected|)`` must be below ``tol``."""
    tol = TOLERANCES.get(expected.dtype, 1e-4) if tol is None else tol
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    err = (actual - expected).abs().max().item() / scale if expected.numel() else 0.0
    if not err <= tol:
        raise AssertionError(f"{what}: max deviation {err:.3e} exceeds {tol:.1e}")


def assert_equivariant(
    func: Callable[..., torch.Tensor],
    inputs: Sequence[tuple[torch.Tensor, int | None, list[int] | None]],
    out_l_max: int | None,
    out_paths: list[int] | None = None,
    tol: float | None = None,
    n_rotations: int = 3,
) -> None:
    """Check ``func(R x...) == R func(x...)`` for random proper and improper rotations.

    Args:
        func: callable on the inputs.
        inputs: ``(tensor, l_max, n_paths)`` per argument; ``l_max=None`` marks an
            invariant argument (weights, indices) passed unchanged; ``l_max=-1`` marks
            Cartesian vectors ``[n, 3]`` rotated as ``v R^T``.
        out_l_max: output rank limit (``None``: output invariant).
        out_paths: output paths per rank.
    """
    base = func(*[t for t, _, _ in inputs])
    for improper in (False, True):
        for _ in range(n_rotations):
            R = random_rotation(improper, dtype=base.dtype)
            args = []
            for t, l_max, paths in inputs:
                if l_max is None:
                    args.append(t)
                elif l_max == -1:
                    args.append(t @ R.T.to(t))
                else:
                    args.append(rotate(t, R, l_max, paths))
            out = func(*args)
            expected = base if out_l_max is None else rotate(base, R, out_l_max, out_paths)
            assert_close(out, expected, tol, what=f"equivariance ({'improper' if improper else 'proper'})")


def assert_forces_are_gradients(
    positions: torch.Tensor, forces: torch.Tensor, energy_fn, h: float = 1e-5, n_checks: int = 6, tol: float = 1e-6
) -> None:
    """Central finite differences of ``energy_fn(positions)`` match ``-forces`` on random entries."""
    g = torch.Generator().manual_seed(0)
    for _ in range(n_checks):
        i = int(torch.randint(0, positions.shape[0], (1,), generator=g))
        k = int(torch.randint(0, 3, (1,), generator=g))
        plus, minus = positions.clone(), positions.clone()
        plus[i, k] += h
        minus[i, k] -= h
        fd = -(float(energy_fn(plus)) - float(energy_fn(minus))) / (2 * h)
        if abs(fd - float(forces[i, k])) > tol * max(1.0, abs(fd)):
            raise AssertionError(f"force [{i}, {k}] = {float(forces[i, k]):.8g} but -dE/dx by finite differences = {fd:.8g}")
