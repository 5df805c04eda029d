import os

import pytest
import torch

# Tests run the network in fp32 whatever the CPU (the numbers they check are fp32's) and measure
# MFU against a fixed peak (no matmul probe per training); set before any test starts a
# subprocess. The tests of the detection and of the probe set their own.
os.environ.setdefault("MDLM_CPU_BF16", "0")
os.environ.setdefault("MDLM_PEAK_TFLOPS", "1")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets the shared session cache for prepared data (read-mostly) unless it
    sets its own; nothing is written to the user's ~/.cache."""
    monkeypatch.setenv("MDLM_CACHE", str(tmp_path_factory.getbasetemp() / "mdlm-cache"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
