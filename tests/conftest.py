import pytest
import torch


@pytest.fixture(scope="session")
def embedded():
    """(model, tokenizer) of the cached embedded policy (built on first use, about 2-3 minutes)."""
    from dppo.model import load_policy

    return load_policy("embedded")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
