"""Simulation-engine integrations (ASE, OpenMM). They depend on flashcart, never the reverse."""
