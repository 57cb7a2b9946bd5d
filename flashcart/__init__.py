"""FlashCart: fast equivariant interatomic potentials built on irreducible Cartesian tensors."""

__version__ = "0.1.0.dev0"
