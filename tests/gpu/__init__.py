"""Tests that need a CUDA GPU (tests/gpu/device_check.sh runs them on a lent machine)."""

import pytest
import torch

#: Every GPU test's marks: slow, and skipped, saying why, where torch sees no CUDA device (CI and
#: the CPU machines have none).
ON_A_GPU = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False here)",
    ),
]
