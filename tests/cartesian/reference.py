"""Independent full-tensor reference for ICT operations (einsum on 3^l arrays)."""

import itertools
from fractions import Fraction
from math import factorial

import torch

from flashcart.cartesian import from_full, to_full


def dfact(n):
    return 1 if n <= 0 else n * dfact(n - 2)


def norm_factor(l1, l2, L):
    k = (l1 + l2 - L) // 2
    J = l1 + l2 + L
    J1, J2, J3 = J - 2 * l1 - 1, J - 2 * l2 - 1, J - 2 * L - 1
    C = Fraction(
        factorial(l1) * factorial(l2) * dfact(2 * L - 1) * factorial((J1 + 1) // 2) * factorial((J2 + 1) // 2),
        factorial(L) * dfact(J1) * dfact(J2) * dfact(J3) * factorial(J // 2),
    )
    return float(Fraction(factorial(L), factorial(l1 - k) * factorial(l2 - k)) * C)


def stf_projector(L, dtype=torch.float64):
    """Orthogonal projector on symmetric traceless rank-L tensors, [3^L, 3^L]."""
    basis = to_full(torch.eye(2 * L + 1, dtype=dtype), L).reshape(2 * L + 1, 3**L).T
    return basis @ torch.linalg.pinv(basis)


def symmetrize(t, L):
    """Average over permutations of the last L axes."""
    if L < 2:
        return t
    lead = t.dim() - L
    perms = list(itertools.permutations(range(L)))
    return sum(t.permute(*range(lead), *[lead + p for p in perm]) for perm in perms) / len(perms)


def path_full(a, b, l1, l2, L):
    """Path (l1, l2) -> L on stored components a: [..., 2l1+1], b: [..., 2l2+1] -> [..., 2L+1]."""
    k = (l1 + l2 - L) // 2
    A, B = to_full(a, l1), to_full(b, l2)
    letters = "ijklmnopqrst"
    ia = letters[:l1]
    ib = ia[l1 - k :] + letters[l1 : l1 + l2 - k]
    out = ia[: l1 - k] + letters[l1 : l1 + l2 - k]
    C = torch.einsum(f"...{ia},...{ib}->...{out}", A, B)
    C = symmetrize(C, L)
    shape = C.shape
    P = stf_projector(L, a.dtype)
    C = (C.reshape(*shape[: len(shape) - L], 3**L) @ P.T).reshape(shape)
    return norm_factor(l1, l2, L) * from_full(C, L)


def expansion_full(u, l):
    """(2l-1)!!/l! * P(u⊗...⊗u) stored, u: [n, 3] unit vectors."""
    t = torch.ones(u.shape[0], dtype=u.dtype)
    for _ in range(l):
        t = t.unsqueeze(-1) * u.reshape(u.shape[0], *([1] * (t.dim() - 1)), 3)
    P = stf_projector(l, u.dtype)
    t = t.reshape(u.shape[0], 3**l) @ P.T
    return dfact(2 * l - 1) / factorial(l) * from_full(t.reshape(u.shape[0], *([3] * l)), l)


def tensor_product_reference(tp, x1, x2, weights, receivers=None, senders=None):
    """Row-by-row reference of TensorProduct.forward from the full-tensor paths."""
    F = tp.out_features
    conv = receivers is not None
    rows = senders.shape[0] if conv else x1.shape[0]

    def block(x, l, F_in, lmax):
        start = sum((2 * m + 1) * F_in for m in range(l))
        return x[:, start : start + (2 * l + 1) * F_in].reshape(x.shape[0], 2 * l + 1, F_in)

    a_src = x1[senders] if conv else x1
    w = weights.reshape(-1, tp.n_paths, F).expand(rows, tp.n_paths, F)
    per_rank = [[] for _ in range(tp.out_l_max + 1)]
    for idx, p in enumerate(tp.paths):
        a = block(a_src, p.l1, tp.in1_features, tp.in1_l_max).expand(rows, -1, F)
        b = block(x2, p.l2, tp.in2_features, tp.in2_l_max).expand(rows, -1, F)
        o = path_full(a.transpose(1, 2), b.transpose(1, 2), p.l1, p.l2, p.l_out).transpose(1, 2)
        per_rank[p.l_out].append(o * w[:, idx, None, :])
    blocks = []
    for l, outs in enumerate(per_rank):
        if tp.reduce_paths:
            blocks.append((sum(outs) if outs else torch.zeros(rows, 2 * l + 1, F, dtype=x2.dtype)).reshape(rows, -1))
        elif outs:
            blocks.append(torch.stack(outs, 2).reshape(rows, -1))
    out = torch.cat(blocks, 1)
    if conv:
        total = torch.zeros(x1.shape[0], out.shape[1], dtype=out.dtype)
        for e in range(rows):
            total[receivers[e]] += out[e]
        out = total
    return out
