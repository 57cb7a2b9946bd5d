import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_and_dtype():
    torch.manual_seed(0)
    yield


def pytest_configure(config):
    # Tests cover product paths up to rank 4; both variables are read when flashcart.cartesian
    # is first imported, which happens after this hook.
    os.environ.setdefault("FLASHCART_KERNEL_L_MAX", "4")
    os.environ.setdefault("FLASHCART_CACHE_DIR", str(config.rootpath / ".pytest_cache" / "flashcart"))
    config.addinivalue_line("markers", "gpu: needs a CUDA device (run with -m gpu on the GPU machine)")
    config.addinivalue_line("markers", "slow: long-running test")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
