"""Problems and where they come from: the embedded task, local jsonl/parquet files, or the hub.

A `Problem` is a prompt with its gold answer. Paper-scale data (MATH, GSM8K, the six eval
benchmarks; docs/engineering.md §4) are read from local `.jsonl`/`.parquet` files, or from the Hugging Face hub
when the path is written `hf:<dataset>[:<split>[:<subset>]]` (needs the `datasets` package and a
network), e.g. `hf:HuggingFaceH4/MATH-500:test` or `hf:openai/gsm8k:test:main`.

The question is the record's `prompt`, `problem` or `question` (the first present, in that order); the gold
answer its `answer`, `final_answer` or `solution` (names matched case-insensitively), normalised by
`answer_text` and `gold_answer`; a record without either, or with an empty one, is an error naming the record. This covers
the real schemas of MATH / MATH-500 (`problem`, `solution` with \boxed{} / `answer`), AIME24 (`answer` as text
or integer), AMC23 (`question`, float `answer`), Minerva Math (`question`, `answer`), OlympiadBench
(`question`, `final_answer` a list of $...$ strings) and GSM8K (`question`, `answer` ending in '#### n'); the
fixtures in tests/fixtures/ hold records in each.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

# Field names tried, in order, for the question and the answer of a record.
QUESTION_FIELDS = ("prompt", "problem", "question")
ANSWER_FIELDS = ("answer", "final_answer", "solution")
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class Problem:
    prompt: str  # the text the policy continues (already formatted)
    answer: str  # gold final answer, compared by the reward with math-verify
    split: str = "train"
    solution: str = ""  # a worked solution, when known (the embedded task's warm-start uses it)


def _records(path: str) -> list[dict]:
    if path.startswith("hf:"):
        try:
            import datasets  # optional: only paper-scale users loading from the hub need it
        except ImportError as e:
            raise ValueError(f"data path {path!r} needs the `datasets` package: pip install -e .[data]") from e
        name, split, subset = (path[3:].split(":") + ["", ""])[:3]
        return list(datasets.load_dataset(name, subset or None, split=split or "train"))
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"data file {path!r} does not exist")
    if p.suffix == ".jsonl":
        return _jsonl(p)
    if p.suffix == ".parquet":
        import pandas as pd

        try:
            return pd.read_parquet(p).to_dict("records")
        except Exception as e:  # pyarrow's errors: not a parquet file, truncated, ...
            raise ValueError(f"data file {path!r} is not a readable parquet file: {str(e).splitlines()[0]}") from None
    raise ValueError(f"data file {path!r} must end in .jsonl or .parquet, or be written hf:<name>[:<split>[:<subset>]]")


def _jsonl(path: Path) -> list[dict]:
    """The JSON objects of a .jsonl file, one per non-blank line; a line that is not UTF-8, not JSON or not an
    object is an error naming the file and the line."""
    out = []
    for n, raw in enumerate(path.read_bytes().splitlines(), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"data file {str(path)!r} line {n} is not UTF-8 text (byte {e.start + 1})") from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"data file {str(path)!r} line {n} is not valid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(record, dict):
            raise ValueError(f"data file {str(path)!r} line {n} must be a JSON object with a question and an answer "
                             f"field, got {type(record).__name__} {line.strip()[:40]}")
        out.append(record)
    return out


def _field(record: dict, names: tuple[str, ...], path: str, n: int, what: str) -> str:
    """The first of `names` the record has (case-insensitive: AIME exports write `Problem`, `Answer`), as text;
    missing or empty is an error naming the file and the record."""
    lower = {str(k).lower(): v for k, v in record.items()}
    for name in names:
        if lower.get(name) is not None:
            text = answer_text(lower[name]) if what == "answer" else str(lower[name]).strip()
            if not text:
                raise ValueError(f"data file {path!r} record {n}: the {what} field {name!r} is empty")
            return text
    raise ValueError(f"data file {path!r} record {n} has no {what} field (accepted: {', '.join(names)}; "
                     f"it has {', '.join(map(str, record)) or 'none'})")


def answer_text(value) -> str:
    """A gold answer field as text, whatever its schema: lists (OlympiadBench's `final_answer`, several answers
    joined by ', '), numbers (AMC23's 27.0 -> '27'), LaTeX wrapped in $...$ (unwrapped)."""
    if hasattr(value, "tolist"):  # numpy arrays / scalars from parquet
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return ", ".join(answer_text(v) for v in value if v is not None)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    while len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text[1:-1].strip()
    return text


def gold_answer(text: str) -> str:
    """The final answer of a gold field: the last \\boxed{...} if there is one (MATH), the part after
    '####' (GSM8K), else the text itself."""
    from dppo.reward import extract_boxed

    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    if "####" in text:
        return text.rsplit("####", 1)[1].strip().replace(",", "")
    return text.strip()


def load_problems(path: str, split: str, template: str = "{question}\n" + MATH_INSTRUCTION,
                  limit: int = 0) -> list[Problem]:
    """Problems of a local jsonl/parquet file or a hub dataset; "{question}" in `template` is replaced
    by the record's question (other braces, such as \\boxed{}, are kept as written)."""
    recs = _records(path)
    if limit:
        recs = recs[:limit]
    if not recs:
        raise ValueError(f"data file {path!r} holds no records")
    out = []
    for n, r in enumerate(recs, 1):
        question = _field(r, QUESTION_FIELDS, path, n, "question")
        answer = gold_answer(_field(r, ANSWER_FIELDS, path, n, "answer"))
        if not answer:
            raise ValueError(f"data file {path!r} record {n}: the answer is empty after extraction (\\boxed{{}} "
                             f"or '####' with nothing after it)")
        out.append(Problem(prompt=template.replace("{question}", question), answer=answer, split=split))
    return out


def overlap(train: list[Problem], evals: dict[str, list[Problem]]) -> dict[str, int]:
    """Per eval split, how many of its prompts also occur in the training problems (contamination)."""
    seen = {p.prompt for p in train}
    return {name: n for name, probs in evals.items() if (n := sum(p.prompt in seen for p in probs))}


def model_prompts(problems: list[Problem], tokenizer, chat_template: bool, template_kwargs: dict | None = None
                  ) -> list[Problem]:
    """The problems as the model is given them (config fields `chat_template`, `chat_template_kwargs`): each prompt a
    user turn of `tokenizer`'s chat template, or, outside one, after the tokenizer's BOS text when the tokenizer adds
    BOS by default (every tokenisation of a prompt here is add_special_tokens=False, as the chat template's text
    carries its own special tokens). A base model expects it: without BOS, Gemma 3 270M's pass@1 on the arithmetic
    task falls to a fraction (docs/results.md, "Gemma 3 270M on the arithmetic task"; why: docs/engineering.md §4.6);
    the embedded models and SmolLM2 add none."""
    if chat_template:
        return with_chat_template(problems, tokenizer, template_kwargs)
    bos = tokenizer.bos_token
    if bos is None or tokenizer("x")["input_ids"][:1] != [tokenizer.bos_token_id]:
        return problems
    return [p if p.prompt.startswith(bos) else dataclasses.replace(p, prompt=bos + p.prompt) for p in problems]


def with_chat_template(problems: list[Problem], tokenizer, template_kwargs: dict | None = None) -> list[Problem]:
    """The same problems with each prompt wrapped as a user turn in `tokenizer`'s chat template;
    `template_kwargs` go to the template (Qwen3: {"enable_thinking": False}, or answers run past 1,024 tokens)."""
    return [dataclasses.replace(p, prompt=tokenizer.apply_chat_template(
        [{"role": "user", "content": p.prompt}], tokenize=False, add_generation_prompt=True, **(template_kwargs or {})))
        for p in problems]
