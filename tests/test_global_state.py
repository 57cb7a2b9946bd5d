"""tests/conftest.py fixtures give global torch state back (tests here run in file order)."""

import pytest
import torch

AT_IMPORT = (torch.get_default_dtype(), torch.backends.cuda.matmul.allow_tf32)


def test_float64_fixture_sets_the_default_dtype(float64):
    assert torch.get_default_dtype() == torch.float64 == float64
    assert torch.randn(2).dtype == torch.float64


def test_a_test_may_change_global_state():
    torch.set_default_dtype(torch.float64)
    torch.backends.cuda.matmul.allow_tf32 = not AT_IMPORT[1]


@pytest.mark.usefixtures("no_tf32")
def test_no_tf32_fixture():
    assert torch.backends.cuda.matmul.allow_tf32 is False and torch.backends.cudnn.allow_tf32 is False


def test_the_state_came_back():
    assert (torch.get_default_dtype(), torch.backends.cuda.matmul.allow_tf32) == AT_IMPORT
    assert AT_IMPORT[0] == torch.float32
