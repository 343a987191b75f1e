"""nbval runs every notebook here at smoke size: the kernels inherit DPPO_SMOKE=1 from this process."""
import os

os.environ["DPPO_SMOKE"] = "1"


def pytest_collection_modifyitems(items):
    """paper_figures after every study notebook, as ./reproduce.sh runs it: it rebuilds their tables from the runs
    they just trained and checks that it makes the same files (stable sort: the rest keep their order)."""
    items.sort(key=lambda item: item.path.name == "paper_figures.ipynb")
