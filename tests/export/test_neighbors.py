"""The exported graphs' neighbour searches: the binned search finds exactly the dense search's pairs."""

from __future__ import annotations

import pytest
import torch

from flashcart.export.neighbors import (
    binned_pair_list,
    fixed_pair_list,
    fullest_bin,
    image_table,
    images_needed,
    pair_list,
    reciprocal_rows,
    wrap_positions,
)


def _both(positions, cell, pbc, cutoff, max_images):
    periodic = torch.tensor(pbc)
    safe = cell if periodic.any() else torch.eye(3, dtype=cell.dtype)
    recip = reciprocal_rows(safe)
    assert (images_needed(recip, cutoff) * periodic <= torch.tensor(max_images)).all()
    pos = wrap_positions(positions, safe, recip, periodic.to(cell.dtype))
    table = image_table(*max_images, cell.dtype, cell.device)
    allowed = ((table == 0) | periodic[None, :]).all(dim=1)
    dense = pair_list(pos, table @ cell, allowed, cutoff)
    binned = binned_pair_list(pos, cell, recip, periodic, max_images, cutoff)
    return dense, binned


def _structure(kind: str, n: int, g: torch.Generator):
    f64 = torch.float64
    if kind == "molecule":
        return torch.randn(n, 3, generator=g, dtype=f64) * 3.0, torch.zeros(3, 3, dtype=f64), (False, False, False)
    cell = torch.eye(3, dtype=f64) * 7.0 + 0.8 * torch.randn(3, 3, generator=g, dtype=f64)  # triclinic
    if kind == "thin cell":  # thinner than the cutoff along every vector: several images, one bin
        cell = cell * 0.35
    if kind == "slab":
        cell[2] = torch.tensor([0.3, -0.2, 18.0], dtype=f64)
    positions = torch.rand(n, 3, generator=g, dtype=f64) @ cell
    if kind == "outside the cell":
        positions = positions + 6.0 * torch.randn(n, 3, generator=g, dtype=f64)
    return positions, cell, (True, True, kind != "slab")


@pytest.mark.parametrize("kind", ["molecule", "crystal", "thin cell", "slab", "outside the cell"])
@pytest.mark.parametrize("n", [1, 2, 57])
def test_binned_search_finds_the_dense_search_pairs(kind, n):
    g = torch.Generator().manual_seed(n)
    positions, cell, pbc = _structure(kind, n, g)
    cutoff = 3.3
    periodic = torch.tensor(pbc)
    need = images_needed(reciprocal_rows(cell if periodic.any() else torch.eye(3, dtype=cell.dtype)), cutoff)
    max_images = tuple(int(k) + 1 if p else 0 for k, p in zip(need.tolist(), pbc))  # one more than needed
    dense, binned = _both(positions, cell, pbc, cutoff, max_images)
    as_set = lambda r, s, i: set(zip(r.tolist(), s.tolist(), i.tolist()))  # noqa: E731
    assert as_set(*binned) == as_set(*dense)
    assert len(binned[0]) == len(as_set(*binned))  # no pair twice
    assert (binned[0][1:] >= binned[0][:-1]).all()  # grouped by receiver
    if kind in ("crystal", "thin cell") and n == 57:
        assert len(dense[0]) > 0


@pytest.mark.parametrize("kind", ["molecule", "crystal", "thin cell", "slab", "outside the cell"])
@pytest.mark.parametrize("search", ["cells", "all-pairs"])
def test_fixed_slots_hold_the_pairs_or_say_they_do_not(kind, search):
    """The fixed-capacity search (static shapes): the dense search's pairs in its real slots,
    grouped by receiver, the free slots spread over the receivers (none gets more than its
    pairs plus its share), and an overflow flag exactly when the slots or a bin are too small."""
    n, cutoff = 57, 3.3
    g = torch.Generator().manual_seed(7)
    positions, cell, pbc = _structure(kind, n, g)
    periodic = torch.tensor(pbc)
    safe = cell if periodic.any() else torch.eye(3, dtype=cell.dtype)
    recip = reciprocal_rows(safe)
    need = images_needed(recip, cutoff)
    max_images = tuple(int(k) + 1 if p else 0 for k, p in zip(need.tolist(), pbc))
    dense, _ = _both(positions, cell, pbc, cutoff, max_images)
    pos = wrap_positions(positions, safe, recip, periodic.to(cell.dtype))
    fullest = fullest_bin(pos, cell, recip, periodic, max_images, cutoff)
    as_set = lambda r, s, i: set(zip(r.tolist(), s.tolist(), i.tolist()))  # noqa: E731
    pairs = len(dense[0])
    per_atom = torch.bincount(dense[0], minlength=n)
    enough = -(-pairs // n) + 3
    bins = fullest if search == "cells" else None
    receivers, senders, image, real, overflow = fixed_pair_list(pos, cell, recip, periodic, max_images, cutoff, enough, bins)
    assert receivers.shape == (n * enough,) and not bool(overflow)
    assert as_set(receivers[real], senders[real], image[real]) == as_set(*dense) and int(real.sum()) == pairs
    assert (receivers[1:] >= receivers[:-1]).all()
    free = ~real
    assert (senders[free] == receivers[free]).all() and (
        image[free] == image_table(*max_images, cell.dtype, cell.device).shape[0] // 2
    ).all()
    share = -(-(n * enough - pairs) // n)
    assert (torch.bincount(receivers, minlength=n) <= per_atom + share).all()
    if pairs:  # too few slots: flagged
        assert bool(fixed_pair_list(pos, cell, recip, periodic, max_images, cutoff, max(1, pairs // n - 1), bins)[4])
    if search == "cells" and fullest > 1:  # a bin that holds fewer atoms than the fullest: flagged
        assert bool(fixed_pair_list(pos, cell, recip, periodic, max_images, cutoff, enough, fullest - 1)[4])
