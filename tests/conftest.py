import os
import tempfile
from pathlib import Path

import pytest
import torch

# run_tests.sh runs the suite on 2 pytest-xdist workers: one intra-op thread each (and in the processes tests start),
# so two workers never ask 2 cores for 4 threads
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"

# Tests that need the machine to themselves (run_tests.sh runs them after the parallel part): the study notebooks
# (they time paired runs, and share T1's smoke runs), the contention checks, and the time-limit and server tests.
SERIAL_FILES = ("test_paired.py", "test_gpu_check.py", "test_jupyterlab.py")
# the parallel part's longest files first (run_tests.sh has pytest-xdist hand files out in this order, not by their
# numbers of tests): one started last would run alone at the end (measured from a fresh clone, --durations=0)
LONGEST_FIRST = ("test_toy_profile.py", "test_trl.py", "test_faults.py", "test_trainer.py")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the marks added here
def pytest_collection_modifyitems(config, items):
    """Mark the serial tests; start test_install's environment.yml resolution (network-bound, ~2 min) as soon as it
    is selected, so it runs beside the rest of the suite; the test waits for it."""
    from test_install import ENV_TEST, start_environment_yml_resolution

    for item in items:
        if item.path.parent.name == "notebooks" or item.path.name in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    if any(item.name == ENV_TEST for item in items) and config.getoption("markexpr", "") != "serial":
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

