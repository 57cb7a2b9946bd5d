"""Unit conversions between FlashCart's units (eV, Å) and OpenMM's (kJ/mol, nm), in one place.

FlashCart models and the ASE calculator use eV for energies, Å for lengths, eV/Å for forces
and eV/Å^3 for stress. OpenMM uses kJ/mol, nm and kJ/mol/nm. The constants follow from the
exact SI values of the elementary charge and the Avogadro constant (CODATA 2018).
"""

from __future__ import annotations

__all__ = [
    "ELEMENTARY_CHARGE",
    "AVOGADRO",
    "KJ_PER_MOL_PER_EV",
    "ANGSTROM_PER_NM",
    "KJ_PER_MOL_NM_PER_EV_ANGSTROM",
    "ev_to_kj_per_mol",
    "kj_per_mol_to_ev",
    "nm_to_angstrom",
    "angstrom_to_nm",
    "ev_per_angstrom_to_kj_per_mol_nm",
    "kj_per_mol_nm_to_ev_per_angstrom",
    "angstrom_per_fs_to_nm_per_ps",
    "nm_per_ps_to_angstrom_per_fs",
]

ELEMENTARY_CHARGE = 1.602176634e-19  # C (exact): 1 eV = this many J
AVOGADRO = 6.02214076e23  # 1/mol (exact)
KJ_PER_MOL_PER_EV = ELEMENTARY_CHARGE * AVOGADRO / 1000.0  # 96.485 332 123 310 0 kJ/mol per eV
ANGSTROM_PER_NM = 10.0
KJ_PER_MOL_NM_PER_EV_ANGSTROM = KJ_PER_MOL_PER_EV * ANGSTROM_PER_NM  # 964.853 kJ/mol/nm per eV/Å


def ev_to_kj_per_mol(energy):
    """Energy (float or array) in eV -> kJ/mol."""
    return energy * KJ_PER_MOL_PER_EV


def kj_per_mol_to_ev(energy):
    """Energy (float or array) in kJ/mol -> eV."""
    return energy / KJ_PER_MOL_PER_EV


def nm_to_angstrom(length):
    """Length (float or array, e.g. positions ``[N, 3]`` or box vectors ``[3, 3]``) in nm -> Å."""
    return length * ANGSTROM_PER_NM


def angstrom_to_nm(length):
    """Length (float or array) in Å -> nm."""
    return length / ANGSTROM_PER_NM


def ev_per_angstrom_to_kj_per_mol_nm(forces):
    """Forces (float or array ``[N, 3]``) in eV/Å -> kJ/mol/nm."""
    return forces * KJ_PER_MOL_NM_PER_EV_ANGSTROM


def kj_per_mol_nm_to_ev_per_angstrom(forces):
    """Forces (float or array ``[N, 3]``) in kJ/mol/nm -> eV/Å."""
    return forces / KJ_PER_MOL_NM_PER_EV_ANGSTROM


def angstrom_per_fs_to_nm_per_ps(velocity):
    """Velocity (float or array ``[N, 3]``) in Å/fs -> nm/ps (1 Å/fs = 100 nm/ps)."""
    return velocity * (1000.0 / ANGSTROM_PER_NM)


def nm_per_ps_to_angstrom_per_fs(velocity):
    """Velocity (float or array ``[N, 3]``) in nm/ps -> Å/fs."""
    return velocity / (1000.0 / ANGSTROM_PER_NM)
