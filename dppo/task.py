"""The embedded synthetic math task (SPEC §4): integer word problems with graded difficulty.

A problem tells a short story about a running count ("Ann has 7 pens. She finds 5 more. ...") and
asks for the final count. Difficulty level L in 1..5 sets the number of operations, the operand
size and whether doubling/tripling appears; the worked solution has one line per operation, so
its length grows with the level. The held-out "ood" split uses more operations than any training
problem. Everything is generated deterministically from a seed, and the eval splits exclude every
prompt that occurs in the train split.

Completion format (what the warm-start teaches and the reward checks):

    "7+5=12\n12-3=9\n\\boxed{9}"
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dppo.data import Problem

# level -> (number of operations, largest operand, multiplication allowed)
LEVELS: dict[str, tuple[int, int, bool]] = {
    "level1": (1, 9, False),
    "level2": (2, 9, False),
    "level3": (3, 9, True),
    "level4": (4, 9, True),
    "level5": (5, 9, True),
    "ood": (7, 9, True),  # out of distribution: more steps than any training problem
}
TRAIN_LEVELS = ("level1", "level2", "level3", "level4", "level5")
EVAL_SPLITS = tuple(LEVELS)
MAX_COUNT = 40  # the running count stays in 0..MAX_COUNT
# How a question becomes the prompt: the format the embedded model is warm-started on (and the default
# prompt_template of a user's own data on the embedded model).
PROMPT_TEMPLATE = "{question}\nAnswer:\n"

NAMES = ("Ann", "Ben", "Cal", "Dee", "Eli", "Fay", "Gus", "Ivy")
PRONOUN = {"Ann": "She", "Ben": "He", "Cal": "He", "Dee": "She", "Eli": "He", "Fay": "She",
           "Gus": "He", "Ivy": "She"}
ITEMS = ("apples", "pens", "coins", "cards", "shells", "books")
ADD_VERBS = ("gets", "finds", "buys", "wins")
SUB_VERBS = ("loses", "gives away", "sells", "drops")


@dataclass(frozen=True)
class _Op:
    symbol: str  # "+", "-" or "*"
    operand: int
    phrase: str


def _sample_ops(rng: random.Random, start: int, n_ops: int, max_operand: int, allow_mul: bool,
                pronoun: str) -> list[_Op]:
    ops, value = [], start
    for _ in range(n_ops):
        choices = []
        if value + 1 <= MAX_COUNT:
            choices += ["+", "+"]
        if value >= 1:
            choices += ["-", "-"]
        if allow_mul and 1 <= value and value * 2 <= MAX_COUNT:
            choices.append("*")
        symbol = rng.choice(choices)
        if symbol == "+":
            operand = rng.randint(1, min(max_operand, MAX_COUNT - value))
            phrase = f"{pronoun} {rng.choice(ADD_VERBS)} {operand} more."
            value += operand
        elif symbol == "-":
            operand = rng.randint(1, min(max_operand, value))
            phrase = f"{pronoun} {rng.choice(SUB_VERBS)} {operand}."
            value -= operand
        else:
            operand = 3 if value * 3 <= MAX_COUNT and rng.random() < 0.5 else 2
            phrase = f"{pronoun} {'doubles' if operand == 2 else 'triples'} them."
            value *= operand
        ops.append(_Op(symbol, operand, phrase))
    return ops


def make_problem(rng: random.Random, split: str, error_rate: float = 0.0) -> Problem:
    """One problem of difficulty `split` (a key of LEVELS), with its worked solution.

    With `error_rate` > 0 each step's result is off by 1 or 2 with that probability and later steps
    continue from the wrong value (a noisy demonstrator; used only for the warm-start data)."""
    n_ops, max_operand, allow_mul = LEVELS[split]
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    start = rng.randint(1, max_operand)
    ops = _sample_ops(rng, start, n_ops, max_operand, allow_mul, PRONOUN[name])
    story = " ".join([f"{name} has {start} {item}."] + [op.phrase for op in ops])
    prompt = PROMPT_TEMPLATE.replace("{question}", f"{story} How many {item} does {name} have now?")
    lines, value, shown = [], start, start
    for op in ops:
        value = _apply(value, op)
        new = max(0, _apply(shown, op))
        if error_rate and rng.random() < error_rate:
            new = max(0, new + rng.choice((-2, -1, 1, 2)))
        lines.append(f"{shown}{op.symbol}{op.operand}={new}")
        shown = new
    solution = "\n".join(lines + [f"\\boxed{{{shown}}}"])
    return Problem(prompt=prompt, answer=str(value), split=split, solution=solution)


def _apply(value: int, op: _Op) -> int:
    return value + op.operand if op.symbol == "+" else value - op.operand if op.symbol == "-" else value * op.operand


def make_split(split: str, n: int, seed: int, exclude: set[str] | None = None) -> list[Problem]:
    """`n` distinct problems of one split, deterministic in `seed`, none of whose prompts is in `exclude`."""
    if split not in LEVELS:
        raise ValueError(f"split must be one of {list(LEVELS)}, got {split!r}")
    rng = random.Random(f"{seed}:{split}")
    seen = set(exclude or ())
    out: list[Problem] = []
    for _ in range(200 * n + 1000):
        if len(out) == n:
            break
        p = make_problem(rng, split)
        if p.prompt not in seen:
            seen.add(p.prompt)
            out.append(p)
    if len(out) < n:
        raise ValueError(f"split {split!r} has fewer than {n} distinct problems")
    return out


def make_train(n: int, seed: int) -> list[Problem]:
    """The RL train split: `n` problems, levels 1-5 in equal shares, shuffled."""
    per = [n // len(TRAIN_LEVELS) + (i < n % len(TRAIN_LEVELS)) for i in range(len(TRAIN_LEVELS))]
    problems = [p for lvl, k in zip(TRAIN_LEVELS, per) for p in make_split(lvl, k, seed)]
    random.Random(seed).shuffle(problems)
    return problems


def make_eval(n_per_split: int, seed: int, train: list[Problem]) -> dict[str, list[Problem]]:
    """Six held-out splits (levels 1-5 and "ood"), disjoint from `train`."""
    exclude = {p.prompt for p in train}
    return {s: make_split(s, n_per_split, seed + 7919, exclude) for s in EVAL_SPLITS}


def tokenizer_corpus(n: int = 3000, seed: int = 0) -> list[str]:
    """Text the embedded tokenizer is trained on: prompts followed by worked solutions."""
    rng = random.Random(f"tok:{seed}")
    return [p.prompt + p.solution for p in (make_problem(rng, s) for s in EVAL_SPLITS for _ in range(n // 6))]
