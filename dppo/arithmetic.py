"""The real-model task (docs/engineering.md §4.6): sums and differences of integers in 1..20, for a small pretrained LLM.

Every problem is one of the 610 facts `a + b` (a, b in 1..20) and `a - b` (a >= b), asked as "What is a + b?". Two
levels by size: "small" (both operands <= 9, 126 facts) and "teens" (an operand in 10..20, 484 facts). A seed shuffles
the facts once: its held-out evaluation split ("heldout") is the first `eval_size`, its training problems the next
`train_size`, so the two never share a fact and each seed has its own split.

Why this task for SmolLM2-135M-Instruct (measured on the base model, temperature 0.7, 32 new tokens, chat template,
"Answer with just the number."; the rates are in docs/engineering.md §4.6): the model often states the right sum in
its own words ("7 + 7 = 14", "The answer is 9") but rarely writes \\boxed{}, so the reward reads the last number
(`answer_format: last_number`); its pass@1 is far higher on small facts than on two-digit ones, in between on the mix,
so a group of 8 completions is often mixed (gradient), and some groups are all-wrong or all-right (pruning
candidates). The base
model's accuracy on each seed's held-out split is the study's step-0 evaluation (figures/T0_real_model.csv).

A base model without a chat turn (Gemma 3 270M) is asked in the form it continues: a prompt template with worked facts
on lines of their own and `{expression}` (the fact itself, "7 + 5") before " =", answered on one line (config field
`stop_strings: ["\\n"]`). A fact shown in the template is never asked.
"""

from __future__ import annotations

import random

from dppo.data import Problem

LIMIT = 20  # operands in 1..LIMIT
SMALL = 9  # "small": both operands <= SMALL
PROMPT_TEMPLATE = "{question} Answer with just the number."  # the real-model configs' prompt_template
EVAL_SPLIT = "heldout"


def all_facts() -> list[Problem]:
    """Every problem of the task, in a fixed order: a + b for a, b in 1..LIMIT, then a - b for a >= b."""
    facts = [(a, "+", b) for a in range(1, LIMIT + 1) for b in range(1, LIMIT + 1)]
    facts += [(a, "-", b) for a in range(1, LIMIT + 1) for b in range(1, a + 1)]
    return [Problem(prompt=f"What is {a} {op} {b}?", answer=str(a + b if op == "+" else a - b),
                    split="small" if max(a, b) <= SMALL else "teens") for a, op, b in facts]


def expression(problem: Problem) -> str:
    """The fact a problem asks, "a + b" (its prompt before any template: "What is a + b?")."""
    return problem.prompt.removeprefix("What is ").removesuffix("?")


def shown(template: str) -> set[str]:
    """The facts a prompt template shows as worked examples: its lines "a op b = n"."""
    return {line.split(" =")[0] for line in template.splitlines() if " = " in line}


def make_split(train_size: int, eval_size: int, seed: int, template: str = PROMPT_TEMPLATE
               ) -> tuple[list[Problem], dict[str, list[Problem]]]:
    """(train problems, {"heldout": eval problems}) of a seed: disjoint, drawn from one shuffle of `all_facts` less
    those `template` shows; each prompt is `template` with '{question}' ("What is a + b?") and '{expression}'
    ("a + b") replaced."""
    examples = shown(template)
    facts = [p for p in all_facts() if expression(p) not in examples]
    if train_size + eval_size > len(facts):
        raise ValueError(f"config fields 'train_size' + 'eval_size' must be at most {len(facts)} on dataset "
                         f"'arithmetic' (its number of problems), got {train_size} + {eval_size}")
    random.Random(f"arithmetic:{seed}").shuffle(facts)

    def ask(p: Problem, split: str) -> Problem:
        return Problem(template.replace("{question}", p.prompt).replace("{expression}", expression(p)), p.answer, split)
    return [ask(p, p.split) for p in facts[eval_size:eval_size + train_size]], \
        {EVAL_SPLIT: [ask(p, EVAL_SPLIT) for p in facts[:eval_size]]}
