"""The embedded task and the math-verify reward."""

import random
import subprocess
import sys
import threading

import pytest

from dppo.errors import MissingDependency
from dppo.reward import _verify, extract_boxed, math_reward
from dppo.task import EVAL_SPLITS, LEVELS, make_eval, make_problem, make_train


def test_generation_is_deterministic_and_splits_disjoint():
    a, b = make_train(200, seed=3), make_train(200, seed=3)
    assert [p.prompt for p in a] == [p.prompt for p in b]
    assert [p.prompt for p in make_train(200, seed=4)] != [p.prompt for p in a]
    evals = make_eval(40, seed=3, train=a)
    assert tuple(evals) == EVAL_SPLITS and len(EVAL_SPLITS) == 6
    train_prompts = {p.prompt for p in a}
    for split, probs in evals.items():
        assert len(probs) == 40 and len({p.prompt for p in probs}) == 40
        assert not train_prompts & {p.prompt for p in probs}, split
    assert {p.split for p in a} == {"level1", "level2", "level3", "level4", "level5"}


@pytest.mark.parametrize("split", list(LEVELS))
def test_worked_solution_is_correct_and_grows_with_level(split):
    rng = random.Random(0)
    for _ in range(50):
        p = make_problem(rng, split)
        lines = p.solution.split("\n")
        assert len(lines) == LEVELS[split][0] + 1  # one line per operation + the boxed answer
        value = None
        for line in lines[:-1]:
            lhs, rhs = line.split("=")
            assert eval(lhs) == int(rhs) and int(rhs) >= 0  # noqa: S307 - our own arithmetic strings
            value = int(rhs)
        assert lines[-1] == f"\\boxed{{{value}}}" and p.answer == str(value)
        assert math_reward(p.solution, p.answer) == 1.0


def test_noisy_demonstrator_makes_slips_at_the_requested_rate():
    clean = [make_problem(random.Random(i), "level1") for i in range(400)]
    noisy = [make_problem(random.Random(i), "level1", error_rate=0.3) for i in range(400)]
    assert all(c.prompt == n.prompt and c.answer == n.answer for c, n in zip(clean, noisy))
    slips = sum(math_reward(n.solution, n.answer) == 0 for n in noisy) / len(noisy)
    assert 0.2 < slips < 0.4  # one operation per level-1 problem: a slip makes the answer wrong


def test_reward_extraction_and_equivalence():
    assert extract_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_boxed("no box") is None and extract_boxed("\\boxed{12") is None
    assert math_reward("3+4=7\n\\boxed{7}", "7") == 1.0
    assert math_reward("\\boxed{7.0}", "7") == 1.0  # math-verify equivalence, not string match
    assert math_reward("\\boxed{0.5}", "\\frac{1}{2}") == 1.0
    assert math_reward("\\boxed{8}", "7") == 0.0


def test_reward_off_the_main_thread_is_the_same(caplog):
    """A trainer in a thread (bench/trl_dppo.py) or TRL's async reward loop scores as the main thread does: math-verify's
    SIGALRM timeouts cannot be set there (they raised, and every answer scored 0), so there it runs without them."""
    cases = [("\\boxed{7}", "7"), ("\\boxed{0.5}", "\\frac{1}{2}"), ("\\boxed{8}", "7"), ("\\boxed{12}", "12")]
    _verify.cache_clear()  # score in the thread first, not from the main thread's cache
    out = []
    worker = threading.Thread(target=lambda: out.extend(math_reward(c, g) for c, g in cases))
    worker.start()
    worker.join()
    assert out == [math_reward(c, g) for c, g in cases] == [1.0, 1.0, 0.0, 1.0]
    assert not [r for r in caplog.records if "Timeout is disabled" in r.getMessage()]


@pytest.mark.parametrize("junk", ["", "\\boxed{", "\\boxed{}", "\\boxed{\\frac{1}{}", "}}}{{{", "\\boxed{x^^2}",
                                  "\\boxed{" + "(" * 200 + "}", "\x00\\boxed{\x00}"])
def test_malformed_output_scores_zero_and_never_raises(junk):
    assert math_reward(junk, "7") == 0.0


@pytest.mark.parametrize("boxed, gold", [("60+96", "156"), ("2*78", "156"), ("(5 - 7652) / 2", "-3823.5"),
                                         ("\\sqrt{4}", "2"), ("3*1", "3"), ("1+1", "2")])
def test_literal_check_refuses_expressions_for_numeric_gold(boxed, gold):
    """math-verify evaluates the box: copying the question's arithmetic scores 1 unless the check is literal."""
    assert math_reward(f"\\boxed{{{boxed}}}", gold, "math") == 1.0
    assert math_reward(f"\\boxed{{{boxed}}}", gold) == 0.0  # literal is the default


@pytest.mark.parametrize("boxed, gold", [("156", "156"), ("156.0", "156"), ("1,000", "1000"), ("$156$", "156"),
                                         ("156 \\text{ apples}", "156"), ("-3", "-3"), ("0.5", "\\frac{1}{2}"),
                                         ("\\frac{1}{2}", "0.5"), ("30^\\circ", "30"), ("1/2", "0.5"),
                                         ("1+\\sqrt{2}", "1+\\sqrt{2}"), ("\\sqrt{2}+1", "1+\\sqrt{2}")])
def test_literal_check_accepts_written_numbers(boxed, gold):
    assert math_reward(f"\\boxed{{{boxed}}}", gold) == 1.0  # symbolic gold answers: math-verify as before


def test_embedded_tokenizer_round_trips_any_text(embedded):
    _, tok = embedded
    texts = ["".join(map(chr, range(32, 127))), "P, (5 - 7652) / 2 = ?", "Ünïcödé 漢字 🙂 \t\n\r ½ ∑ ≠",
             bytes(range(256)).decode("latin-1"), "\x00\x01\x7f"]
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text


def _hidden_math_verify(monkeypatch):
    """Imports of math_verify fail from here on, as where it is not installed (an air-gapped GPU image)."""
    monkeypatch.setitem(sys.modules, "math_verify", None)  # `import math_verify` raises ImportError
    _verify.cache_clear()  # a cached verdict must not hide the missing checker


def test_a_missing_checker_raises_one_line_naming_the_install_command(monkeypatch):
    """Without math-verify every answer used to score 0 (the ImportError was taken for a wrong answer): a run that
    learns nothing and says nothing. It raises now, wrong answers and right ones alike."""
    _hidden_math_verify(monkeypatch)
    for completion in ("\\boxed{4}", "\\boxed{5}"):
        with pytest.raises(MissingDependency) as e:
            math_reward(completion, "4")
        assert "\n" not in str(e.value) and "pip install 'math-verify" in str(e.value), e.value
    assert math_reward("no answer here", "4") == 0.0  # nothing to check: still 0, no checker needed
    monkeypatch.undo()
    _verify.cache_clear()
    assert math_reward("\\boxed{4}", "4") == 1.0  # the checker back: the same call scores


def test_train_without_the_checker_stops_in_one_line_before_loading_anything(tmp_path):
    code = ("import sys; sys.modules['math_verify'] = None; from dppo.cli import main; "
            f"sys.exit(main(['train', '--output_dir', {str(tmp_path / 'run')!r}, '--max_steps', '1']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dppo: error: the reward's answer checker math-verify"), lines
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
