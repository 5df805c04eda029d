import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets the shared session cache for prepared data (read-mostly) unless it
    sets its own; nothing is written to the user's ~/.cache."""
    monkeypatch.setenv("MDLM_CACHE", str(tmp_path_factory.getbasetemp() / "mdlm-cache"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
