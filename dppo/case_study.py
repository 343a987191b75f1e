"""The case study of figure F5 (docs/method.md §6): one held-out problem, each method's sampled answers at every
kept checkpoint. Sampling goes through the runs' rollout engine (`rollout_backend`), as training did."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dppo.config import TrainConfig
from dppo.data import model_prompts
from dppo.runfiles import read_metrics
from dppo.trainer import load_data


def case_study_answers(runs: dict[str, Path], split: str = "ood", samples: int = 32, seed: int = 0) -> pd.DataFrame:
    """F5 data: the `split` problem on which the methods' final models disagree most (by sampled accuracy),
    then for each method, at the initial model, at every kept checkpoint and at its final model (when no checkpoint
    of the last step was kept: the paper profile keeps none after final/), the counts of its sampled final
    answers. Columns: method, step, answer, count, samples, correct, question."""
    import torch
    from safetensors.torch import load_file

    from dppo.model import load_policy
    from dppo.reward import extract_boxed, math_reward
    from dppo.rollout import SamplingParams, engine_from_config

    cfg = TrainConfig.load(Path(next(iter(runs.values()))) / "config.yaml")
    model, tok = load_policy(cfg.model_name_or_path)
    problems = model_prompts(load_data(cfg)[1][split], tok, cfg.chat_template, cfg.chat_template_kwargs)
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    engine = engine_from_config(cfg, model, tok, [p.prompt for p in problems])  # the runs' own rollout backend

    def sample(state: dict | None, prompts: list[str], n: int) -> list[str]:
        if state is not None:
            # checkpoints hold the trainer's TokenLogprobs ("policy." prefix); the tied lm_head is not stored
            missing, unexpected = model.load_state_dict(
                {k.removeprefix("policy."): v.to(model.device) for k, v in state.items()}, strict=False)
            assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
            engine.sync_weights(model)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return engine.generate(prompts, SamplingParams(n=n, max_new_tokens=cfg.max_new_tokens)).texts

    initial = {k: v.clone() for k, v in model.state_dict().items()}
    finals = {m: load_file(str(Path(d) / "final" / "model.safetensors")) for m, d in runs.items()}
    acc = {}
    for m, state in finals.items():
        texts = sample(state, [p.prompt for p in problems], 8)
        acc[m] = [sum(math_reward(t, p.answer) for t in texts[i * 8:(i + 1) * 8]) / 8 for i, p in enumerate(problems)]
    spread = [max(a[i] for a in acc.values()) - min(a[i] for a in acc.values()) for i in range(len(problems))]
    problem = problems[max(range(len(problems)), key=lambda i: (spread[i], -i))]
    rows = []
    for m, d in runs.items():
        ckpts = sorted(Path(d).glob("checkpoints/step_*/model.safetensors"), key=lambda p: int(p.parent.name[5:]))
        points = [(0, initial)] + [(int(p.parent.name[5:]), load_file(str(p))) for p in ckpts]
        last = read_metrics(Path(d) / "metrics.jsonl")[-1]["step"]
        if points[-1][0] != last:
            points.append((last, finals[m]))
        for step, state in points:
            counts: dict[str, int] = {}
            for t in sample(state, [problem.prompt], samples):
                a = extract_boxed(t) or "(none)"
                counts[a] = counts.get(a, 0) + 1
            rows += [{"method": m, "step": step, "answer": a, "count": c, "samples": samples,
                      "correct": math_reward(f"\\boxed{{{a}}}", problem.answer) > 0, "question": problem.prompt,
                      "gold": problem.answer}
                     for a, c in counts.items()]
    return pd.DataFrame(rows)
