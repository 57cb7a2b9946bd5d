"""The explicit package list in pyproject.toml covers every package in the tree."""

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "flashcart").rglob("__init__.py") if "_generated" not in p.parts}
    found |= {"flashcart.configs", "flashcart.integrations"}
    assert found == listed
