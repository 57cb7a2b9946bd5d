"""Independent full-tensor reference for ICT operations (einsum on 3^l arrays)."""

import functools
import itertools
from fractions import Fraction
from math import factorial

import torch

from flashcart.cartesian import from_full, to_full


def dfact(n):
    return 1 if n <= 0 else n * dfact(n - 2)


@functools.lru_cache(maxsize=None)
def stf_projector(L, dtype=torch.float64):
    """Orthogonal projector on symmetric traceless rank-L tensors, [3^L, 3^L] (row-major).

    Built from the definition alone (the null space of ``1 - symmetrizer`` stacked with the
    trace over the first index pair), not from the library's storage conventions.
    """
    n = 3**L
    if L < 2:
        return torch.eye(n, dtype=dtype)
    flat = torch.arange(n).reshape([3] * L)
    perms = list(itertools.permutations(range(L)))
    sym = torch.zeros(n, n, dtype=torch.float64)
    for perm in perms:
        sym[flat.reshape(-1), flat.permute(*perm).reshape(-1)] += 1 / len(perms)
    trace = torch.zeros(3 ** (L - 2), n, dtype=torch.float64)
    for a in range(3):
        trace[torch.arange(3 ** (L - 2)), flat[a, a].reshape(-1)] = 1
    _, s, vh = torch.linalg.svd(torch.cat([torch.eye(n, dtype=torch.float64) - sym, trace]))
    null = vh[int((s > 1e-10).sum()) :]
    assert null.shape[0] == 2 * L + 1, (L, null.shape)
    return (null.T @ null).to(dtype)


def expansion_full_tensor(u, l):
    """T^l(u) = (2l-1)!!/l! * P_l(u⊗...⊗u) as a full [3]*l array, u: [3] unit vector (spec section 2)."""
    t = torch.ones((), dtype=u.dtype)
    for _ in range(l):
        t = torch.tensordot(t, u, dims=0)
    return dfact(2 * l - 1) / factorial(l) * (stf_projector(l, u.dtype) @ t.reshape(-1)).reshape([3] * l)


def unnormalized_path_full(A, B, l1, l2, L):
    """Contract k index pairs of full tensors A (rank l1) and B (rank l2), symmetrize and project: [3^L]."""
    k = (l1 + l2 - L) // 2
    C = torch.tensordot(A, B, dims=(list(range(l1 - k, l1)), list(range(k))))
    return stf_projector(L, A.dtype) @ C.reshape(-1)


@functools.lru_cache(maxsize=None)
def norm_factor(l1, l2, L):
    """N(l1, l2, L) derived numerically, independently of the closed formula of spec section 3.

    Characterisation: for a unit vector u the normalised path maps the direction expansions
    T^l1(u), T^l2(u) to T^L(u). Every pinned value of spec section 3 satisfies it (for example
    (1,1)->2: (3/4)[2 u u - (2/3) I] = T^2(u)). The factor is the least-squares ratio for a
    random direction; the residual is checked, so a path that does not have the property fails
    here rather than producing a meaningless number. Returned as an exact fraction.
    """
    gen = torch.Generator().manual_seed(1234 + 100 * l1 + 10 * l2 + L)
    u = torch.randn(3, generator=gen, dtype=torch.float64)
    u = u / u.norm()
    raw = unnormalized_path_full(expansion_full_tensor(u, l1), expansion_full_tensor(u, l2), l1, l2, L)
    target = expansion_full_tensor(u, L).reshape(-1)
    n = float(raw @ target / (raw @ raw))
    assert float((n * raw - target).norm()) < 1e-12 * max(1.0, float(target.norm())), (l1, l2, L)
    exact = Fraction(n).limit_denominator(1000)
    assert abs(float(exact) - n) < 1e-12, (l1, l2, L, n)
    return exact


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
    return float(norm_factor(l1, l2, L)) * from_full(C, L)


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
