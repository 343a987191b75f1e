"""The paper profile end to end, at toy scale (`./reproduce.sh --profile paper --toy`; experiments/paper/toy.yaml
lists everything the toy changes), every study it runs, as a new user runs it: the paper's recipes through the real
orchestration — papermill, each run its own launched process group (torchrun; T1 on 2 gloo processes), the paper's
data loaders on benchmark-schema records — then paper_figures with its completeness check, reporting into the toy
root's figures/paper/; the command must end with exit 0."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dppo import studies, toy
from dppo.config import ConfigError, TrainConfig
from dppo.trainer import read_metrics

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = list(TrainConfig.load(ROOT / "experiments/paper/dppo_qwen3_4b_math.yaml").eval_datasets)


def _digest(folder: Path) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())).hexdigest()


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """./reproduce.sh --profile paper --toy (every study, then paper_figures) into a fresh toy root."""
    root = tmp_path_factory.mktemp("toy")
    cpu_figures = _digest(ROOT / "figures")
    env = {**os.environ, "DPPO_TOY_ROOT": str(root)}
    env.pop("DPPO_TOY", None)
    done = subprocess.run(["bash", "reproduce.sh", "--profile", "paper", "--toy"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return root, done.stdout + done.stderr, cpu_figures


def test_every_study_of_the_profile_ran_then_paper_figures_found_them_all(toy_run):
    root, log, _ = toy_run
    ran = [s.name for s in studies.DEFAULT_RUN] + ["paper_figures"]  # in order (reproduce.sh's time per study)
    assert [ln.split()[0] for ln in log.split("time per study:\n", 1)[1].splitlines()[:len(ran)]] == ran
    assert all((root / "notebooks" / f"{name}.ipynb").is_file() for name in ran)
    # paper_figures ran its completeness check (complete, not smoke) over what the profile's studies make, and only that
    executed = (root / "notebooks" / "paper_figures.ipynb").read_text()
    assert "complete: the " in executed and "written into" in executed
    out = root / "figures" / "paper"
    for study in studies.STUDIES:
        for name in study.figures:
            assert (out / f"{name}.png").is_file() == study.in_default_run, name  # R1's curves: only when named


def test_t1_trains_the_paper_recipes_each_launched_on_two_processes(toy_run):
    root, _, _ = toy_run
    log = (root / "notebooks" / "main_results.ipynb").read_text()  # the executed notebook: dppo.launch's commands
    paper = studies.paper_params("main_results")
    toy_spec = toy.spec()
    trained = studies.study_layouts("main_results", **studies.layout_params(paper), report=lambda line: None)["T1"]
    for label, (cpu_config, over, sub) in studies.T1_RUNS.items():
        if label not in trained:  # the shared-prompt rows: the paper profile trains none (`shared_rows: false`)
            continue
        run = root / "paper" / sub / "seed0"
        assert f"--nproc_per_node 2 -m dppo.cli train --config {run}/launch.yaml" in log, label
        saved = TrainConfig.load(run / "config.yaml").to_dict()
        recipe = TrainConfig.load(ROOT / paper["configs"][label], {**over, **paper["overrides"], "seed": 0}).to_dict()
        # the paper recipe but for what toy.yaml changes: its fields, the hub model and the hub data made local (and
        # where the run goes; a new folder starts with resume off)
        changed = {k for k in saved if saved[k] != recipe[k]}
        assert changed <= set(toy_spec["fields"]) | {"model_name_or_path", "dataset", "eval_datasets", "output_dir",
                                                      "resume"}, \
            (label, {k: (recipe[k], saved[k]) for k in changed - set(toy_spec["fields"])})
        assert Path(saved["model_name_or_path"]) == root / "models" / "Qwen--Qwen3-4B"
        assert json.loads((root / "models/Qwen--Qwen3-4B/toy.json").read_text())["stands_for"] == recipe["model_name_or_path"]
        assert {k: Path(v).name for k, v in saved["eval_datasets"].items()} == \
            {k: Path(toy_spec["data"][v]).name for k, v in recipe["eval_datasets"].items()}
        steps = [r for r in read_metrics(run / "metrics.jsonl") if r["step"] > 0]
        assert steps and all(r["processes"] == 2 for r in steps), label
        # the paper profile keeps no checkpoint once final/ is written
        assert (run / "final" / "model.safetensors").is_file() and not (run / "checkpoints").exists(), label


def test_tables_have_a_column_per_paper_benchmark_and_the_cpu_figures_stay(toy_run):
    root, _, cpu_figures = toy_run
    out = root / "figures" / "paper"
    for study in studies.DEFAULT_RUN:  # every table: a row per run of its layout as the toy trained it
        layouts = studies.study_layouts(study.name, **studies.layout_params(toy.study_params(study.name)))
        for recipe in study.tables:
            got = pd.read_csv(out / f"{recipe.name}.csv", index_col=0)
            assert list(got.index) == list(layouts[recipe.key]), recipe.name
            for split in BENCHMARKS + ["avg"]:
                assert f"acc/{split}" in got.columns, (recipe.name, split)
    t1 = [label for label in studies.T1_RUNS if label not in studies.TABLES["T1"].layout_rows]  # no shared rows here
    assert list(pd.read_csv(out / "T1_main_results.csv", index_col=0).index) == t1
    table = (out / "T1_main_results.md").read_text()
    assert all(f" {b} " in table for b in BENCHMARKS) and "CPU" not in table.split("\n\n", 1)[1]
    for name in ("F1_method_overview", "F2_training_curves", "F5_case_study"):
        assert (out / f"{name}.png").is_file(), name
    case = pd.read_csv(root / "paper" / "case_study.csv")  # a MATH-500 problem (experiments/paper/case_study.yaml)
    math500 = {json.loads(ln)["problem"] for ln in (ROOT / "tests/fixtures/math500.jsonl").read_text().splitlines()}
    assert any(q in case["question"].iloc[0] for q in math500)
    assert set(case["method"]) == set(t1) and case.groupby("method")["step"].max().gt(0).all()
    assert _digest(ROOT / "figures") == cpu_figures  # the CPU tables and figures were not touched
    assert (root / "notebooks" / "paper_figures.ipynb").is_file()


def test_toy_refuses_a_hub_source_it_has_no_local_copy_of(monkeypatch, tmp_path):
    monkeypatch.setenv("DPPO_TOY_ROOT", str(tmp_path))
    cfg = TrainConfig.load(ROOT / "experiments/paper/grpo_qwen3_4b_math.yaml")
    with pytest.raises(ConfigError, match="config field 'eval_datasets.extra': the toy has no local copy of 'hf:x/y'"):
        toy.apply(TrainConfig(**{**cfg.to_dict(), "eval_datasets": {**cfg.eval_datasets, "extra": "hf:x/y"}}))
    with pytest.raises(ConfigError, match="'model_name_or_path': the toy has no stand-in for 'hf:Qwen/Qwen3-32B'"):
        toy.apply(TrainConfig(**{**cfg.to_dict(), "model_name_or_path": "hf:Qwen/Qwen3-32B"}))
    params = toy.study_params("main_results")  # paper parameters + toy.yaml's, merged key by key
    assert params["launch"] == {**studies.paper_params("main_results")["launch"], "launcher": "torchrun",
                                "num_processes": 2}
    assert params["configs"] == studies.paper_params("main_results")["configs"]
    assert yaml.safe_load(subprocess.run([sys.executable, "-m", "dppo.toy", "params", "scale"], cwd=ROOT, text=True,
                                         capture_output=True, check=True).stdout)["launch"]["num_processes"] == 1


def test_toy_model_speaks_qwen3s_chat_format(monkeypatch, tmp_path):
    """The stand-in's tokenizer wraps a prompt as Qwen3's template does, empty thinking block when enable_thinking is
    false (what the paper YAMLs' chat_template_kwargs pass)."""
    from transformers import AutoTokenizer

    monkeypatch.setenv("DPPO_TOY_ROOT", str(tmp_path))
    tok = AutoTokenizer.from_pretrained(toy.model_dir("hf:Qwen/Qwen3-4B"))
    turn = [{"role": "user", "content": "What is 2 + 3?"}]
    assert tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True, enable_thinking=False) == \
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True).endswith("<|im_start|>assistant\n")
