"""Paper-scale data loading, exercised on local files (no hub access in tests)."""

import json

import pandas as pd
import pytest

from dppo.data import gold_answer, load_problems, with_chat_template


def test_jsonl_math_and_gsm8k_style_records(tmp_path):
    f = tmp_path / "mix.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"problem": "What is 1/2 + 1/2?", "solution": "It is $\\boxed{1}$."},   # MATH: answer in \boxed{}
        {"question": "Tom has 3 apples...", "answer": "3 + 4 = 7\n#### 1,007"},   # GSM8K: after ####
        {"problem": "AIME", "answer": "204"},
    ]))
    probs = load_problems(str(f), "mix", template="Q: {question}")
    assert [p.answer for p in probs] == ["1", "1007", "204"]
    assert probs[0].prompt == "Q: What is 1/2 + 1/2?" and probs[0].split == "mix"
    assert len(load_problems(str(f), "mix", limit=2)) == 2


def test_parquet_records(tmp_path):
    f = tmp_path / "m.parquet"
    pd.DataFrame({"problem": ["a", "b"], "answer": ["\\frac{1}{2}", "3"]}).to_parquet(f)
    assert [p.answer for p in load_problems(str(f), "t")] == ["\\frac{1}{2}", "3"]


def test_bad_files_give_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_problems(str(tmp_path / "nope.jsonl"), "t")
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(ValueError, match="must end in"):
        load_problems(str(tmp_path / "x.csv"), "t")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"text": "no question field"}))
    with pytest.raises(ValueError, match="record 1 has no question field"):
        load_problems(str(tmp_path / "bad.jsonl"), "t")


def test_gold_answer_prefers_boxed_then_hashes():
    assert gold_answer("so \\boxed{\\frac{3}{4}}") == "\\frac{3}{4}"
    assert gold_answer("blah #### 42") == "42"
    assert gold_answer(" 17 ") == "17"


def test_chat_template_wraps_prompts(embedded, tmp_path):
    _, tok = embedded
    tok = type(tok).from_pretrained(tok.name_or_path)
    tok.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"problem": "2+2?", "answer": "4"}))
    [p] = with_chat_template(load_problems(str(f), "t", template="{question}"), tok)
    assert p.prompt == "<user>2+2?<assistant>" and p.answer == "4"


def test_chat_template_kwargs_reach_the_template(embedded, tmp_path):
    """chat_template_kwargs (Qwen3: enable_thinking=False) are passed to the template."""
    _, tok = embedded
    tok = type(tok).from_pretrained(tok.name_or_path)
    tok.chat_template = ("{% for m in messages %}{{ m.content }}{% endfor %}"
                         "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"problem": "2+2?", "answer": "4"}))
    problems = load_problems(str(f), "t", template="{question}")
    assert with_chat_template(problems, tok)[0].prompt == "2+2?"
    assert with_chat_template(problems, tok, {"enable_thinking": False})[0].prompt == "2+2?<think></think>"
