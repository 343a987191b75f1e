"""Every method of one table trains with one update layout (dppo.studies.LAYOUT_FIELDS), so a speed-up in it is the
method's and not the layout's; rows that vary the layout on purpose are named in their table's `layout_rows` and
share one layout among themselves. Checked on the configs each profile's notebooks train: the CPU profile (the
notebooks' defaults, R1's real model among them), the paper profile (experiments/paper/<study>.yaml) and its toy
(toy.yaml's parameters and fields over the paper's), and the real profile (`dppo.studies.real_params`)."""

import dataclasses

import pytest

from dppo import studies, toy
from dppo.config import TrainConfig

PROFILES = {
    "cpu": (lambda study: {}, lambda cfg: cfg),
    "paper": (studies.paper_params, lambda cfg: cfg),
    "real": (studies.real_params, lambda cfg: cfg),
    "toy": (toy.study_params, lambda cfg: dataclasses.replace(cfg, **toy.spec()["fields"])),
}
TABLE_STUDIES = [s.name for s in studies.STUDIES if s.tables]


def row_configs(study: str, profile: str) -> dict[str, dict[str, TrainConfig]]:
    """{table: {row label: the TrainConfig its runs train with}} of a study under a profile."""
    params, apply = PROFILES[profile]
    layouts = studies.study_layouts(study, **studies.layout_params(params(study)), report=lambda line: None)
    return {key: {label: apply(TrainConfig.load(studies.ROOT / cfg, over)) for label, (cfg, over, _) in layout.items()}
            for key, layout in layouts.items()}


def layout_of(cfg: TrainConfig) -> tuple:
    """The fields that make a run's update layout: packing, the row capacity and the micro-batch budget (rows when
    padded, tokens when packed)."""
    return tuple(getattr(cfg, f) for f in studies.LAYOUT_FIELDS)


def mixed_layouts(key: str, rows: dict[str, TrainConfig]) -> list[str]:
    """What differs in layout within table `key`: the table's methods, and its `layout_rows` among themselves."""
    declared = studies.TABLES[key].layout_rows
    problems = []
    for group in ([label for label in rows if label not in declared], [label for label in rows if label in declared]):
        seen = {layout_of(rows[label]) for label in group}
        if len(seen) > 1:
            problems.append(f"{key}: " + "; ".join(f"{label}: {dict(zip(studies.LAYOUT_FIELDS, layout_of(rows[label])))}"
                                                   for label in group))
    return problems


@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("study", TABLE_STUDIES)
def test_every_method_of_a_table_trains_on_one_layout(study, profile):
    if profile != "cpu" and study == "real_model":
        pytest.skip("R1 runs only on the CPU profile (the paper profile's T1 is its comparison)")
    if profile == "real" and study not in studies.REAL_STUDIES:
        pytest.skip(f"the real profile does not run {study}")
    tables = row_configs(study, profile)
    assert tables, study
    problems = [p for key, rows in tables.items() for p in mixed_layouts(key, rows)]
    assert not problems, "\n".join(problems)
    if profile != "cpu":  # every row of the paper profile trains a paper recipe (a row the configs miss would not)
        cpu_rows = [label for rows in tables.values() for label, cfg in rows.items() if cfg.dataset == "embedded"]
        assert not cpu_rows, f"{study}: rows still on the CPU configs under the {profile} profile: {cpu_rows}"


def test_the_shared_prompt_rows_are_on_the_shared_layout_and_against_grpo_on_it():
    """T1's and R1's `layout_rows` show what dppo's shared-prompt layout gives each method: both on `packing:
    shared`, DPPO's against GRPO's on it, while every other row is padding-free (dense) against dense GRPO."""
    for study, key in (("main_results", "T1"), ("real_model", "R1")):
        rows, table = row_configs(study, "cpu")[key], studies.TABLES[key]
        assert set(table.layout_rows) == {"GRPO, shared prompts", "DPPO, shared prompts"} <= set(rows)
        assert {rows[label].packing for label in table.layout_rows} == {"shared"}
        assert {cfg.packing for label, cfg in rows.items() if label not in table.layout_rows} == {"dense"}
        assert table.baseline("DPPO, shared prompts") == "GRPO, shared prompts"
        assert table.baseline("GRPO, shared prompts") == table.baseline("DPPO") == "GRPO"


def test_a_row_on_another_layout_is_found():
    """The check itself: a padded GRPO beside a packed DPPO (the configs before this test existed) is reported."""
    rows = row_configs("ablations", "cpu")["T4"]
    rows["GRPO"] = dataclasses.replace(rows["GRPO"], packing="none")
    assert mixed_layouts("T4", rows) and "GRPO" in mixed_layouts("T4", rows)[0]
