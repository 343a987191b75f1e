import tempfile
from pathlib import Path

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """Start test_install's environment.yml resolution (network-bound, ~2 min) as soon as it is selected, so it runs
    beside the rest of the suite; the test waits for it."""
    from test_install import ENV_TEST, start_environment_yml_resolution

    if any(item.name == ENV_TEST for item in items):
        workdir = Path(tempfile.mkdtemp(prefix="dppo-env-yml-"))
        config._env_resolution = (start_environment_yml_resolution(workdir), workdir)


def pytest_unconfigure(config):
    started = getattr(config, "_env_resolution", None)
    if started and started[0].poll() is None:  # the test was deselected or the run stopped early
        started[0].kill()


@pytest.fixture(scope="session")
def embedded():
    """(model, tokenizer) of the cached embedded policy (built on first use, about 2-3 minutes)."""
    from dppo.model import load_policy

    return load_policy("embedded")


@pytest.fixture(scope="session")
def embedded64(embedded):
    """The embedded policy in float64 (a copy), for checks that two computations agree: in float64 their rounding
    differences (~1e-15) cannot decide a verdict, whatever CPU, kernel or thread count computed them."""
    import copy

    return copy.deepcopy(embedded[0]).double(), embedded[1]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)

