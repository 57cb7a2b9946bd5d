"""Where the Triton kernels' tests run: ``needs_triton`` (skip without Triton, or without both
CUDA and the interpreter), ``CPU`` (the interpreter, ``TRITON_INTERPRET=1``) and ``DEVICES``
(``CPU`` and ``cuda``, the latter marked ``gpu``: run with ``-m gpu`` on the GPU machine)."""

import os

import pytest
import torch

from flashcart.cartesian._backend import triton_available

needs_triton = pytest.mark.skipif(
    not triton_available() or not (os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()),
    reason="Triton kernels need CUDA or TRITON_INTERPRET=1",
)
CPU = pytest.param("cpu", marks=pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter off"))
DEVICES = [CPU, pytest.param("cuda", marks=pytest.mark.gpu)]
