"""Verifiable reward (docs/engineering.md §4): the last \\boxed{...} of a completion, checked with math-verify.

    reward(completion, gold) = 1 if math_verify.verify(parse(gold), parse(\\boxed{extracted})) else 0

math-verify compares *values*, and evaluates expressions to get them: \\boxed{60+96} equals 156, so a policy
that copies the question's arithmetic into the box is paid for a computation it never did. `check="literal"`
(the default, config field `answer_check`) closes that: where the gold answer is a number (integer, decimal or
fraction), the boxed answer must be a number too (units in \\text{}, $, %, degree signs and thousands commas
aside) before math-verify compares the values; symbolic gold answers (\\sqrt{2}, intervals, ...) are compared by
math-verify alone, as with `check="math"`.

`answer_format="last_number"` (config field `answer_format`) reads the answer of a completion without \\boxed{} as its
last number, as lm-evaluation-harness's GSM8K "flexible-extract" does: a small pretrained model (the real-model task,
dppo.arithmetic) states answers in its own words ("7 + 7 = 14") far more often than in \\boxed{}. A \\boxed{} answer,
when there is one, still wins; only the last number counts, so listing candidates gains nothing.

The same function scores the embedded task and paper-scale MATH/GSM8K. Malformed output (no
\\boxed{}, unbalanced braces, unparsable LaTeX) scores 0 and never raises. A missing math-verify is not a wrong answer:
it raises `MissingDependency` (one line with the install command), as does `require_checker`, which the trainer calls
before it loads anything.
"""

from __future__ import annotations

import logging
import re
import threading
from functools import lru_cache

from dppo.errors import MissingDependency

ANSWER_CHECKS = ("literal", "math")
INSTALL_CHECKER = ("pip install 'math-verify>=0.9' (on a node without a package index: bash scripts/gpu_wheels.sh "
                   "here, then docs/usage.md's air-gapped recipe)")
ANSWER_FORMATS = ("boxed", "last_number")
# a number not glued to a preceding word, digit or operator: "-3" alone is negative, the 2 of "4-2" is not
_LAST_NUMBER = re.compile(r"(?<![\w.\-])-?\d+(?:\.\d+)?|(?<=[\w.\-])\d+(?:\.\d+)?")
_DECORATION = re.compile(r"\\(?:text|mbox|mathrm|textbf)\{[^{}]*\}|\^\{?\\circ\}?|\\[%!,;: ]|[$%\s]")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)|[-+]?\d+/\d+|[-+]?\\[dt]?frac\{\d+\}\{\d+\}|[-+]?\\[dt]?frac\d\d")


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} in `text` with balanced braces, or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


class _WithoutTimeoutNotice(logging.Filter):
    """Drops math-verify's notice that a call runs without its timeout (every call off the main thread, below)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_WithoutTimeoutNotice())


def require_checker():
    """The math_verify module, or `MissingDependency` naming the install command (math-verify, or one of its own
    dependencies such as latex2sympy2_extended, not importable)."""
    try:
        import math_verify
    except ImportError as e:
        raise MissingDependency(f"the reward's answer checker math-verify cannot be imported ({e}); install it: "
                                f"{INSTALL_CHECKER}") from None
    return math_verify


@lru_cache(maxsize=65536)
def _verify(gold: str, pred: str) -> bool:
    math_verify = require_checker()
    parse, verify = math_verify.parse, math_verify.verify
    # math-verify's timeouts are SIGALRM, which only the main thread may set: elsewhere (a trainer in a thread, TRL's
    # async reward loop) they raise and every answer would score 0, so off the main thread there is no timeout
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    g, p = parse(f"${gold}$", parsing_timeout=limit), parse(f"\\boxed{{{pred}}}", parsing_timeout=limit)
    return bool(g) and bool(p) and bool(verify(g, p, timeout_seconds=limit))


def is_number(text: str) -> bool:
    """Whether `text` is a plain number (integer, decimal, a/b, \\frac{a}{b}) once units and formatting are removed."""
    return bool(_NUMBER.fullmatch(_THOUSANDS.sub("", _DECORATION.sub("", text))))


def extract_answer(text: str, answer_format: str = "boxed") -> str | None:
    """The answer of a completion: its last \\boxed{...}; with answer_format="last_number" and no \\boxed{}, its last
    number (thousands commas removed), or None."""
    boxed = extract_boxed(text)
    if boxed is not None or answer_format == "boxed":
        return boxed
    numbers = _LAST_NUMBER.findall(_THOUSANDS.sub("", text))
    return numbers[-1] if numbers else None


def math_reward(completion: str, gold: str, check: str = "literal", answer_format: str = "boxed") -> float:
    """1.0 if the completion's answer (`extract_answer`: its last boxed answer, or its last number) equals `gold`
    (math-verify), else 0.0; with check="literal" a numeric gold answer also needs a numeric answer (module
    docstring)."""
    pred = extract_answer(completion, answer_format)
    if not pred:
        return 0.0
    if check == "literal" and is_number(gold) and not is_number(pred):
        return 0.0
    try:
        return float(_verify(gold.strip(), pred))
    except MissingDependency:  # no checker is not a wrong answer
        raise
    except Exception:  # math-verify can raise on pathological LaTeX; that is a wrong answer
        return 0.0
