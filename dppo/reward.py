"""Verifiable reward (docs/method.md §4): the last \\boxed{...} of a completion, checked with math-verify.

    reward(completion, gold) = 1 if math_verify.verify(parse(gold), parse(\\boxed{extracted})) else 0

The same function scores the embedded task and paper-scale MATH/GSM8K. Malformed output (no
\\boxed{}, unbalanced braces, unparsable LaTeX) scores 0 and never raises.
"""

from __future__ import annotations

from functools import lru_cache


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


@lru_cache(maxsize=65536)
def _verify(gold: str, pred: str) -> bool:
    from math_verify import parse, verify

    g, p = parse(f"${gold}$"), parse(f"\\boxed{{{pred}}}")
    return bool(g) and bool(p) and bool(verify(g, p))


def math_reward(completion: str, gold: str) -> float:
    """1.0 if the completion's last boxed answer equals `gold` (math-verify), else 0.0."""
    pred = extract_boxed(completion)
    if not pred:
        return 0.0
    try:
        return float(_verify(gold.strip(), pred))
    except Exception:  # math-verify can raise on pathological LaTeX; that is a wrong answer
        return 0.0
