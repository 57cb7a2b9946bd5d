"""On-disk cache of generated sources.

Generated modules are written the first time a backend is loaded and reused by later
processes. A file is keyed by the package version, a digest of the code generators and
``FLASHCART_KERNEL_L_MAX``, so updating FlashCart or changing the rank limit generates new
files. Each file starts with a line holding the SHA-256 of the rest: a truncated or
corrupted file fails the check and is regenerated. Writes go to a temporary file in the
same directory followed by ``os.replace``, so concurrent writers both succeed and readers
never see partial files.

Location: ``FLASHCART_CACHE_DIR``, else ``$XDG_CACHE_HOME/flashcart``, else
``~/.cache/flashcart``. If that directory cannot be created or written, a warning names it
and the sources go to a private temporary directory for this process instead.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Callable

import flashcart
from flashcart.utils.io import atomic_write_text

__all__ = ["cache_dir", "kernel_l_max", "load_generated", "generator_digest", "DEFAULT_KERNEL_L_MAX"]

DEFAULT_KERNEL_L_MAX = 3
_HEADER = "# flashcart-generated sha256="


def kernel_l_max() -> int:
    """``FLASHCART_KERNEL_L_MAX`` (default 3): the highest rank generated modules include."""
    raw = os.environ.get("FLASHCART_KERNEL_L_MAX", "")
    if raw.strip() == "":
        return DEFAULT_KERNEL_L_MAX
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"FLASHCART_KERNEL_L_MAX must be a non-negative integer, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"FLASHCART_KERNEL_L_MAX must be a non-negative integer, got {raw!r}")
    return value


def cache_dir() -> Path:
    """The cache directory (not created here)."""
    if os.environ.get("FLASHCART_CACHE_DIR"):
        return Path(os.environ["FLASHCART_CACHE_DIR"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "flashcart"
    return Path.home() / ".cache" / "flashcart"


@lru_cache(maxsize=1)
def generator_digest() -> str:
    """Digest of the package version and the code that derives and emits sources."""
    h = hashlib.sha256(flashcart.__version__.encode())
    here = Path(__file__).parent
    for path in sorted(here.rglob("*.py")):
        h.update(str(path.relative_to(here)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


_fallback_dir: Path | None = None


def _writable_dir() -> Path:
    global _fallback_dir
    target = cache_dir() / "generated"
    try:
        target.mkdir(parents=True, exist_ok=True)
        if not os.access(target, os.W_OK):
            raise PermissionError(f"no write permission on {target}")
        return target
    except OSError as err:
        if _fallback_dir is None:
            _fallback_dir = Path(tempfile.mkdtemp(prefix="flashcart-generated-"))
            warnings.warn(
                f"FlashCart cannot write its generated-source cache at {target} ({err}); "
                f"using {_fallback_dir} for this process. Set FLASHCART_CACHE_DIR to a "
                "writable directory to keep generated sources between runs.",
                stacklevel=3,
            )
        return _fallback_dir


def _verified_body(path: Path) -> str | None:
    """File body if its checksum line matches, else ``None``."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    first, sep, body = text.partition("\n")
    if not sep or not first.startswith(_HEADER):
        return None
    if hashlib.sha256(body.encode()).hexdigest() != first[len(_HEADER) :].strip():
        return None
    return body


def _atomic_write(path: Path, body: str) -> None:
    atomic_write_text(path, f"{_HEADER}{hashlib.sha256(body.encode()).hexdigest()}\n{body}")


def generated_path(name: str, l_max: int) -> Path:
    """Where the module ``name`` for rank limit ``l_max`` lives."""
    return _writable_dir() / f"{name}_l{l_max}_{generator_digest()}.py"


def load_generated(name: str, l_max: int, generate: Callable[[int], str]) -> ModuleType:
    """Import the generated module ``name``, generating and caching it first if needed.

    Args:
        name: module family, e.g. ``"torch_ops"``.
        l_max: rank limit the module covers.
        generate: ``generate(l_max) -> source``; called only on a cache miss.
    """
    path = generated_path(name, l_max)
    if _verified_body(path) is None:
        if path.exists():
            warnings.warn(f"regenerating corrupted FlashCart cache file {path}", stacklevel=2)
        _atomic_write(path, generate(l_max))
    module_name = f"flashcart._generated.{path.stem}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
