"""The case study of figure F5 (docs/method.md §6): one held-out problem a seed, each method's sampled answers at every
kept checkpoint. The problem is chosen by a rule fixed before any run trains and blind to the methods: among the
split's first candidates whose right answer the initial model samples at least once, the one on which its sampled
answers are most split (`most_split`), so there is room to settle on the right answer or on a wrong one. Sampling
goes through the runs' rollout engine (`rollout_backend`) at their training temperature, and answers are read and
graded as their reward read them (`answer_format`, `answer_check`). The verdict reads each method's last checkpoint
(`dppo.verdicts.final_right`, `dppo.verdicts.case_study`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dppo.config import TrainConfig
from dppo.data import model_prompts
from dppo.runfiles import read_metrics


PICK_SAMPLES = 16  # answers of the initial model sampled per candidate problem to choose the one F5 follows
# One seed's answers (`case_study_answers`), written beside the runs it follows once sampled, and committed with their
# logs under the real profile: the checkpoints it sampled are not committed (0.54 GB each), so these stand for them.
ANSWERS = "case_study/answers_seed{seed}.csv"
_TEXT = {"answer": str, "question": str, "gold": str}  # read back as written: "16" stays the string "16"


def answers_path(root: str | Path, seed: int) -> Path:
    """Where seed `seed`'s answers are kept under a study root (`results.study_root`)."""
    return Path(root) / ANSWERS.format(seed=seed)


def save_answers(answers: pd.DataFrame, root: str | Path, seed: int) -> Path:
    """Write one seed's answers (`case_study_answers`) to `answers_path`."""
    path = answers_path(root, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    answers.to_csv(path, index=False)
    return path


def answered(runs: list[tuple[TrainConfig, Path]], seed: int, root: str | Path) -> bool:
    """Whether seed `seed`'s saved answers stand for its runs `runs` ((config, folder) each): the file is there and
    every run is logged in its folder as trained to its end by this code (`results.logged`: weights not needed), so a
    fresh clone neither trains those runs nor samples their checkpoints again. Not for a run unfinished, another
    config, other code, or under ./reproduce.sh --retrain: the seed is trained and sampled again."""
    from dppo import results

    return answers_path(root, seed).is_file() and all(results.logged(cfg, out) for cfg, out in runs)


def saved_answers(layout: dict, seed: int, root: str | Path, smoke: bool = False) -> pd.DataFrame | None:
    """Seed `seed`'s saved answers where they stand for the runs of `layout` (`dppo.studies`) for that seed under
    `root` (`answered`); None otherwise."""
    from dppo import results, studies

    runs = [(results._config(config, Path(root) / sub, smoke, **over), Path(root) / sub)
            for specs in studies.runs_for(layout, [seed]).values() for config, over, sub in specs]
    return pd.read_csv(answers_path(root, seed), dtype=_TEXT, keep_default_na=False) \
        if answered(runs, seed, root) else None


def most_split(answers: list[list[str]]) -> int:
    """The index of the problem whose sampled answers are most split: the largest share outside its most sampled
    answer (1 - top count / samples), ties to more distinct answers, then to the first."""
    def split(i: int) -> tuple[float, int, int]:
        counts = pd.Series(answers[i]).value_counts()
        return (1.0 - counts.iloc[0] / len(answers[i]) if len(answers[i]) else 0.0, len(counts), -i)
    return max(range(len(answers)), key=split)


def case_study_answers(runs: dict[str, Path], split: str = "", samples: int = 32, seed: int = 0,
                       candidates: int = 0) -> pd.DataFrame:
    """F5 data for one seed: the problem of eval split `split` ("": `ood` where the task has it, else its first split;
    the arithmetic task's is `heldout`), among its first `candidates` (0: all), on which the initial model's
    PICK_SAMPLES sampled answers are most split (`most_split`, among the problems whose right answer it samples at
    least once: chosen from the initial model alone, before any method's result), then for each method, at the
    initial model, at every kept checkpoint and at its final model (when no checkpoint of the last step was kept: the
    paper profile keeps none after final/), the counts of its sampled final answers, sampling seed `seed` (the runs').
    Columns: seed, method, step, answer, count, samples, correct, question, gold."""
    import torch
    from safetensors.torch import load_file

    from dppo.model import load_policy
    from dppo.reward import extract_answer, math_reward
    from dppo.rollout import SamplingParams, engine_from_config
    from dppo.trainer import load_data

    cfg = TrainConfig.load(Path(next(iter(runs.values()))) / "config.yaml")
    model, tok = load_policy(cfg.model_name_or_path)
    evals = load_data(cfg)[1]
    split = split or ("ood" if "ood" in evals else next(iter(evals), ""))
    if split not in evals:
        raise ValueError(f"case study: split {split!r} is not one of the runs' eval splits {sorted(evals)}")
    asked = evals[split][:candidates] if candidates else evals[split]
    problems = model_prompts(asked, tok, cfg.chat_template, cfg.chat_template_kwargs)  # as the model is asked
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
            return engine.generate(prompts, SamplingParams(n=n, temperature=cfg.temperature,
                                                           max_new_tokens=cfg.max_new_tokens)).texts

    def grade(text: str, gold: str) -> bool:  # as the runs' reward
        return math_reward(text, gold, cfg.answer_check, cfg.answer_format) > 0

    initial = {k: v.clone() for k, v in model.state_dict().items()}
    finals = {m: load_file(str(Path(d) / "final" / "model.safetensors")) for m, d in runs.items()}
    texts = sample(None, [p.prompt for p in problems], PICK_SAMPLES)  # the initial model's (loaded above)
    drawn = [texts[i * PICK_SAMPLES:(i + 1) * PICK_SAMPLES] for i in range(len(problems))]
    # the problems whose right answer the initial model samples at least once (a right answer there to settle on; all
    # of them where none has one)
    open_ = [i for i, p in enumerate(problems) if any(grade(t, p.answer) for t in drawn[i])]
    open_ = open_ or list(range(len(problems)))
    pick = open_[most_split([[extract_answer(t, cfg.answer_format) or "(none)" for t in drawn[i]] for i in open_])]
    problem, question = problems[pick], asked[pick].prompt  # the question as written (no chat turn around it)
    rows = []
    for m, d in runs.items():
        ckpts = sorted(Path(d).glob("checkpoints/step_*/model.safetensors"), key=lambda p: int(p.parent.name[5:]))
        points = [(0, initial)] + [(int(p.parent.name[5:]), load_file(str(p))) for p in ckpts]
        last = read_metrics(Path(d) / "metrics.jsonl")[-1]["step"]
        if points[-1][0] != last:
            points.append((last, finals[m]))
        for step, state in points:
            counts: dict[str, int] = {}
            correct: dict[str, bool] = {}
            for t in sample(state, [problem.prompt], samples):
                a = extract_answer(t, cfg.answer_format) or "(none)"
                counts[a] = counts.get(a, 0) + 1
                correct[a] = correct.get(a, False) or grade(t, problem.answer)
            rows += [{"seed": seed, "method": m, "step": step, "answer": a, "count": c, "samples": samples,
                      "correct": correct[a], "question": question, "gold": problem.answer}
                     for a, c in counts.items()]
    return pd.DataFrame(rows)
