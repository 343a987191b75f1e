"""Live progress outside the notebook (`./reproduce.sh` follows $DPPO_PROGRESS_FILE): each seed's runs of a study
layout (trained in turn) are announced with their position, its steps with the bar's count and ETA, and its end with its time; seeds
train into their own folders."""

from dppo import results, studies


def test_run_layout_writes_run_and_step_progress_per_seed(tmp_path, monkeypatch):
    log = tmp_path / "progress.log"
    monkeypatch.setenv("DPPO_PROGRESS_FILE", str(log))
    layout = {"GRPO": studies.T1_RUNS["GRPO"]}
    runs = results.run_layout(layout, seeds=[0, 1], smoke=True, root=tmp_path / "results")
    assert [d.name for d in runs["GRPO"]] == ["seed0", "seed1"]
    assert all((d / "final" / "model.safetensors").is_file() for d in runs["GRPO"])
    lines = log.read_text().splitlines()
    assert any("training 1/2: GRPO, seed 0 -> main_results/grpo/seed0" in ln for ln in lines), lines
    assert any("training 2/2: GRPO, seed 1" in ln and "min left" in ln for ln in lines), lines  # ETA from run 1
    steps = [ln for ln in lines if "grpo/seed1: step 2 |" in ln]
    assert steps and "<" in steps[-1] and ("prompt/s" in steps[-1] or "s/prompt" in steps[-1]), lines  # ETA, rate
    assert sum("done in" in ln for ln in lines) == 2
    # the two seeds saw different problems (seed = data), every method of one seed the same
    from dppo.config import TrainConfig
    from dppo.trainer import load_data

    cfgs = [TrainConfig.load(d / "config.yaml") for d in runs["GRPO"]]
    assert [c.seed for c in cfgs] == [0, 1]
    first_prompts = [[p.prompt for p in load_data(c)[0]] for c in cfgs]  # what each seed trained on, by construction
    assert first_prompts[0] != first_prompts[1]
