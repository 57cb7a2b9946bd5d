import os
from pathlib import Path

import pytest
import torch


def _global_torch_state():
    return (
        torch.get_default_dtype(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )


def _set_global_torch_state(state):
    dtype, matmul_tf32, cudnn_tf32, precision = state
    torch.set_default_dtype(dtype)
    torch.set_float32_matmul_precision(precision)  # also sets matmul.allow_tf32; restore that after
    torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
    torch.backends.cudnn.allow_tf32 = cudnn_tf32


@pytest.fixture(autouse=True)
def _seed_and_global_state():
    """Seed every test; put back the default dtype and TF32 flags whatever the test did."""
    torch.manual_seed(0)
    state = _global_torch_state()
    yield
    _set_global_torch_state(state)


@pytest.fixture
def float64():
    """Default dtype float64 for one test (``pytestmark = pytest.mark.usefixtures("float64")``
    for a module); the previous default comes back afterwards."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield torch.float64
    torch.set_default_dtype(previous)


@pytest.fixture
def no_tf32():
    """Full-precision float32 matmuls and convolutions on CUDA for one test; restored afterwards."""
    state = _global_torch_state()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    _set_global_torch_state(state)


# Tests cover product paths up to rank 4; both variables are read when flashcart.cartesian is
# first imported. Set here, at this conftest's import, which comes before any deeper conftest
# imports flashcart (set in pytest_configure, they came too late when pytest was given a
# subdirectory's files first, e.g. tests/model/test_predictor.py tests/cartesian/...).
os.environ.setdefault("FLASHCART_KERNEL_L_MAX", "4")
os.environ.setdefault("FLASHCART_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".pytest_cache" / "flashcart"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (run with -m gpu on the GPU machine)")
    config.addinivalue_line("markers", "slow: long-running test")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
