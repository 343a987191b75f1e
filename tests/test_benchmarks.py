"""The paper's training set and eval benchmarks in their real schemas (fixtures in tests/fixtures/, a few records
each, as the hub datasets hold them): the loader finds question and gold answer, and math-verify scores a correct
completion 1 and a wrong one 0 for every record (docs/engineering.md §4)."""

from pathlib import Path

import pytest

from dppo.data import load_problems
from dppo.reward import math_reward

FIXTURES = Path(__file__).parent / "fixtures"
# benchmark fixture -> per record: (gold answer as loaded, a correct completion, a wrong completion)
CASES = {
    "math_train": [("12", "so the answer is \\boxed{12}.", "\\boxed{13}"),
                   ("\\frac{7}{12}", "Hence \\boxed{\\frac{7}{12}}", "\\boxed{\\frac{12}{7}}")],
    "math500": [("\\left( 3, \\frac{\\pi}{2} \\right)", "\\boxed{(3, \\frac{\\pi}{2})}", "\\boxed{(3, \\pi)}"),
                ("27", "The cube is \\boxed{27}.", "\\boxed{64}")],
    "aime24": [("204", "\\boxed{204}", "\\boxed{240}")],
    "aime24_maxwell": [("25", "\\boxed{25}", "\\boxed{5}")],
    "amc23": [("27", "They meet \\boxed{27} miles from A.", "\\boxed{18}"), ("36", "\\boxed{36}", "\\boxed{6}")],
    "minerva": [("1.6", "\\boxed{1.6}", "\\boxed{16}"), ("4.5e33", "\\boxed{4.5e33}", "\\boxed{4.5e32}")],
    "olympiadbench": [("(2 n-1) ! !", "\\boxed{(2 n-1) ! !}", "\\boxed{(2 n) ! !}"), ("40", "\\boxed{40}", "\\boxed{41}"),
                      ("-2, 2", "\\boxed{-2, 2}", "\\boxed{2}")],
    "gsm8k": [("18", "She makes \\boxed{18} dollars.", "\\boxed{9}"), ("3", "\\boxed{3}", "\\boxed{2}")],
}


@pytest.mark.parametrize("name", list(CASES))
def test_real_schema_loads_and_scores(name):
    problems = load_problems(str(FIXTURES / f"{name}.jsonl"), name)
    assert [p.answer for p in problems] == [gold for gold, _, _ in CASES[name]]
    for p, (_, right, wrong) in zip(problems, CASES[name]):
        assert "{question}" not in p.prompt and "\\boxed{}" in p.prompt
        assert math_reward(right, p.answer) == 1.0, (name, p.answer, right)
        assert math_reward(wrong, p.answer) == 0.0, (name, p.answer, wrong)


def test_avg_and_pass_at_k_per_split_with_its_own_k():
    """avg@k = mean reward over the k samples of every problem; pass@k = share of problems with a correct sample;
    a split can take its own k (AIME / AMC need more samples); every split in one generate call."""
    from dppo.data import Problem
    from dppo.evaluation import evaluate
    from dppo.rollout import RolloutBatch

    class Scripted:  # prompt "i": its first i samples (counted over the call) are right, the rest wrong
        calls = []

        def generate(self, prompts, params):
            self.calls.append((list(prompts), params.n))
            seen, texts = {}, []
            for p in prompts:
                for _ in range(params.n):
                    j = seen[p] = seen.get(p, -1) + 1
                    texts.append(f"\\boxed{{{int(p) if j < int(p) else -1}}}")
            return RolloutBatch([[0]] * len(texts), [[1]] * len(texts), [None] * len(texts), texts, [False] * len(texts))

    splits = {"easy": [Problem(prompt="2", answer="2"), Problem(prompt="0", answer="0")],
              "aime": [Problem(prompt="1", answer="1"), Problem(prompt="0", answer="0")]}
    engine = Scripted()
    acc = evaluate(engine, splits, k=4, temperature=1.0, max_new_tokens=8, k_per_split={"aime": 8})
    assert engine.calls == [(["2", "0", "1", "1", "0", "0"], 4)]  # one call: n = gcd(4, 8), AIME's problems twice
    assert acc["easy"] == pytest.approx(2 / 8) and acc["easy/pass@4"] == pytest.approx(0.5)
    assert acc["aime"] == pytest.approx(1 / 16) and acc["aime/pass@8"] == pytest.approx(0.5)
    assert acc["avg"] == pytest.approx((2 / 8 + 1 / 16) / 2)
