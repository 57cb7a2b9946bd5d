"""Pinned values of spec/cartesian.md and the storage conventions."""

import itertools
from fractions import Fraction

import pytest
import torch

from flashcart.cartesian import (
    DirectionExpansion,
    TensorProduct,
    enumerate_paths,
    from_full,
    path_normalization,
    stored_components,
    to_full,
)
from flashcart.cartesian._backend import torch_ops

from .reference import expansion_full, norm_factor, path_full

# float64 for every test here (tests/conftest.py restores the previous default afterwards)
pytestmark = pytest.mark.usefixtures("float64")


def test_stored_component_order_matches_spec():
    assert stored_components(2) == ((2, 0, 0), (0, 2, 0), (1, 1, 0), (1, 0, 1), (0, 1, 1))
    assert stored_components(3) == ((3, 0, 0), (2, 1, 0), (2, 0, 1), (1, 2, 0), (1, 1, 1), (0, 2, 1), (0, 3, 0))
    assert stored_components(4)[:5] == ((4, 0, 0), (3, 1, 0), (2, 2, 0), (1, 3, 0), (0, 4, 0))
    assert stored_components(4)[5:] == ((3, 0, 1), (2, 1, 1), (1, 2, 1), (0, 3, 1))


@pytest.mark.parametrize("l", range(5))
def test_to_full_is_symmetric_traceless_and_inverts_from_full(l):
    x = torch.randn(4, 2 * l + 1)
    t = to_full(x, l)
    for perm in itertools.permutations(range(l)):
        assert torch.allclose(t, t.permute(0, *[1 + p for p in perm]))
    if l >= 2:
        assert torch.allclose(torch.diagonal(t, dim1=1, dim2=2).sum(-1), torch.zeros(()), atol=1e-12)
    assert torch.equal(from_full(t, l), x)


def test_normalization_pinned_values():
    # spec section 3's table, written as the factor in front of the symmetric traceless
    # projection of the contracted outer product: (1,1)->2 is (3/4)*2*P(a⊗b), (2,2)->2 is 2*P(AB),
    # (2,1)->3 is (5/9)*3*P(A⊗b) (S sums 3 placements).
    pinned = {(0, 0, 0): 1, (1, 1, 0): 1, (2, 2, 0): Fraction(2, 3), (3, 3, 0): Fraction(2, 5), (1, 1, 2): Fraction(3, 2)}
    pinned |= {(2, 2, 2): 2, (2, 1, 3): Fraction(5, 3), (1, 2, 3): Fraction(5, 3)}
    pinned |= {(l, 0, l): 1 for l in range(5)} | {(0, l, l): 1 for l in range(5)}
    for path, value in pinned.items():
        assert path_normalization(*path) == value, path


def test_normalization_matches_an_independent_derivation():
    # reference.norm_factor derives N numerically from full 3^l tensors (normalised paths map
    # direction expansions to direction expansions), not from the closed formula of _paths.py.
    paths = [(l1, l2, L) for l1, l2, L in itertools.product(range(5), repeat=3) if abs(l1 - l2) <= L <= l1 + l2 and (l1 + l2 + L) % 2 == 0]
    assert len(paths) == 42
    for path in paths:
        assert path_normalization(*path) == norm_factor(*path), path


def _path(l1, l2, L, a, b):
    return getattr(torch_ops(), f"tp_{l1}_{l2}_{L}")(a[..., None], b[..., None])[..., 0]


def test_pinned_product_values():
    n = 6
    a1, b1 = torch.randn(n, 3), torch.randn(n, 3)
    A, B = torch.randn(n, 5), torch.randn(n, 5)
    A3, B3 = torch.randn(n, 7), torch.randn(n, 7)
    s, t = torch.randn(n, 1), torch.randn(n, 1)
    FA, FB = to_full(A, 2), to_full(B, 2)
    eye = torch.eye(3)
    # contractions to rank 0
    assert torch.allclose(_path(0, 0, 0, s, t), s * t)
    assert torch.allclose(_path(1, 1, 0, a1, b1)[:, 0], (a1 * b1).sum(1))
    assert torch.allclose(_path(2, 2, 0, A, B)[:, 0], 2 / 3 * (FA * FB).sum((1, 2)))
    assert torch.allclose(_path(3, 3, 0, A3, B3)[:, 0], 2 / 5 * (to_full(A3, 3) * to_full(B3, 3)).sum((1, 2, 3)))
    # (l, 0) -> l is scaling
    for l, x in ((1, a1), (2, A), (3, A3)):
        assert torch.allclose(_path(l, 0, l, x, s), x * s)
    # (1,1)->2
    ab = a1[:, :, None] * b1[:, None, :]
    expected = 0.75 * (ab + ab.transpose(1, 2) - 2 / 3 * eye * (a1 * b1).sum(1)[:, None, None])
    assert torch.allclose(to_full(_path(1, 1, 2, a1, b1), 2), expected)
    # (2,2)->2
    AB = FA @ FB
    expected = AB + AB.transpose(1, 2) - 2 / 3 * eye * AB.diagonal(dim1=1, dim2=2).sum(-1)[:, None, None]
    assert torch.allclose(to_full(_path(2, 2, 2, A, B), 2), expected)
    # (2,1)->3: (5/9)[S(A⊗b) - (2/5) S(δ⊗(A·b))], S = sum over the 3 cyclic placements
    Ab = torch.einsum("nij,nj->ni", FA, b1)
    AxB = torch.einsum("nij,nk->nijk", FA, b1)
    dAb = torch.einsum("ij,nk->nijk", eye, Ab)

    def S(t):
        return t + t.permute(0, 2, 3, 1) + t.permute(0, 3, 1, 2)

    expected = 5 / 9 * (S(AxB) - 2 / 5 * S(dAb))
    assert torch.allclose(to_full(_path(2, 1, 3, A, b1), 3), expected)


def test_pinned_expansion_values():
    r = torch.randn(10, 3)
    u = r / r.norm(dim=1, keepdim=True)
    out = DirectionExpansion(2, backend="torch")(r)
    assert torch.allclose(out[:, 0], torch.ones(10))
    assert torch.allclose(out[:, 1:4], u)
    T2 = 1.5 * (u[:, :, None] * u[:, None, :] - torch.eye(3) / 3)
    assert torch.allclose(to_full(out[:, 4:9], 2), T2)


@pytest.mark.parametrize("l", range(5))
def test_expansion_matches_full_tensor_projection(l):
    r = torch.randn(7, 3)
    out = DirectionExpansion(l, backend="torch")(r)[:, l * l :]
    u = r / r.norm(dim=1, keepdim=True)
    assert torch.allclose(out, expansion_full(u, l), atol=1e-12)
    t = to_full(out, l)
    if l >= 2:
        assert torch.allclose(torch.diagonal(t, dim1=1, dim2=2).sum(-1), torch.zeros(()), atol=1e-12)


@pytest.mark.parametrize("path", enumerate_paths(4, 4, 4), ids=lambda p: f"{p.l1}{p.l2}{p.l_out}")
def test_every_path_matches_full_tensor_reference_and_is_traceless(path):
    a, b = torch.randn(5, 2 * path.l1 + 1), torch.randn(5, 2 * path.l2 + 1)
    out = _path(path.l1, path.l2, path.l_out, a, b)
    assert torch.allclose(out, path_full(a, b, path.l1, path.l2, path.l_out), atol=1e-12)
    full = to_full(out, path.l_out)
    if path.l_out >= 2:
        assert full.diagonal(dim1=1, dim2=2).sum(-1).abs().max() < 1e-12
        assert torch.allclose(full, full.transpose(1, 2))


def test_path_order_follows_spec():
    names = [(p.l1, p.l2, p.l_out) for p in enumerate_paths(2, 1, 2)]
    assert names == [(0, 0, 0), (1, 1, 0), (1, 0, 1), (2, 1, 1), (0, 1, 1), (1, 1, 2), (2, 0, 2)]
    sym = [(p.l1, p.l2, p.l_out) for p in enumerate_paths(2, 2, 2, symmetric=True)]
    assert sym == [(0, 0, 0), (1, 1, 0), (2, 2, 0), (1, 0, 1), (2, 1, 1), (1, 1, 2), (2, 0, 2), (2, 2, 2)]
    tp = TensorProduct(2, 1, 2, 3, 3)
    assert tp.n_paths == 7 and tp.n_paths_per_rank == [2, 3, 2]


def test_ranks_above_kernel_limit_name_the_variable():
    from flashcart.cartesian import KERNEL_L_MAX

    with pytest.raises(ValueError, match="FLASHCART_KERNEL_L_MAX"):
        TensorProduct(KERNEL_L_MAX + 1, 0, 0, 1, 1)
