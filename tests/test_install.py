"""What the README's install commands give a new user: `jupyter lab` in the environment, extras pip can resolve
(flash-attn is a documented separate step, never an extra that fails to build)."""

import sys
from importlib.metadata import requires
from pathlib import Path


def test_jupyterlab_is_installed_with_the_notebooks():
    assert (Path(sys.executable).parent / "jupyter-lab").is_file()


def test_extras_name_no_package_that_cannot_build_from_pip():
    reqs = requires("dppo") or []
    assert not any(r.startswith("flash-attn") or r.startswith("flash_attn") for r in reqs), reqs
    assert any(r.startswith("datasets") and 'extra == "data"' in r for r in reqs)
    assert any(r.startswith("vllm") and 'extra == "gpu"' in r for r in reqs)
