"""Every bad input a user can hand dppo ends in one line on stderr (`dppo: error: ...` naming the field, file or
line) and exit status 2 — never a traceback, never silent acceptance (docs/engineering.md §4.3)."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dppo.cli import main

ROOT = Path(__file__).resolve().parents[1]
GRPO_YAML = str(ROOT / "experiments" / "cpu" / "grpo.yaml")
TINY = ["--train_size", "10", "--eval_size", "2", "--eval_samples", "1", "--prompts_per_step", "2", "--group_size",
        "2", "--max_new_tokens", "4", "--max_steps", "1", "--eval_every", "1000"]


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the CLI in-process; assert exit status 2 and exactly one stderr line `dppo: error: ...`."""
    code = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("dppo: warning:")
             and not re.search(r"\d+%\|", ln)]  # progress bars (loading weights) are not messages
    assert code == 2, (code, err)
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("dppo: error: "), err
    return lines[0]


def write(path: Path, data: bytes | str) -> str:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


RECORD = '{"question": "What is 2+3?", "answer": "5"}\n'
# name -> (file content, what the error must name)
BAD_DATA = {
    "bare_number": (RECORD + "42\n", "line 2"),
    "bare_string": (RECORD + '"hello"\n', "line 2"),
    "list_line": ('[1, 2]\n', "line 1"),
    "broken_json": (RECORD + '{"question": "x", \n', "line 2"),
    "not_utf8": (RECORD.encode() + b'{"question": "\xff\xfe", "answer": "1"}\n', "line 2"),
    "no_question": ('{"text": "2+3", "answer": "5"}\n', "question field"),
    "no_answer": ('{"question": "2+3"}\n', "answer field"),
    "empty_answer": ('{"question": "2+3", "answer": ""}\n', "empty"),
    "empty_boxed_answer": ('{"question": "2+3", "solution": "so \\\\boxed{}"}\n', "empty"),
    "empty_question": ('{"question": "  ", "answer": "5"}\n', "empty"),
    "null_answer": ('{"question": "2+3", "answer": null}\n', "answer field"),
    "empty_file": ("", "no records"),
    "blank_lines_only": ("\n\n  \n", "no records"),
}


@pytest.mark.parametrize("name", sorted(BAD_DATA))
def test_bad_data_file(capsys, tmp_path, name):
    content, must_name = BAD_DATA[name]
    data = write(tmp_path / f"{name}.jsonl", content)
    err = one_line_error(capsys, ["train", "--dataset", data, "--output_dir", str(tmp_path / "run"), *TINY])
    assert f"{name}.jsonl" in err and must_name in err, err


def test_bad_parquet(capsys, tmp_path):
    data = write(tmp_path / "fake.parquet", "not parquet at all")
    assert "fake.parquet" in one_line_error(capsys, ["train", "--dataset", data, "--output_dir", str(tmp_path / "r")])


_HAS_CUDA = torch.cuda.is_available()


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


BAD_FIELDS = [  # (override, field named in the error)
    (["--lr", ".inf"], "lr"),
    (["--lr", "nan"], "lr"),
    (["--lr", "1e400"], "lr"),
    (["--kl_coef", ".inf"], "kl_coef"),
    (["--epochs", ".inf"], "epochs"),
    (["--epochs", "0"], "epochs"),
    (["--max_grad_norm", "-1"], "max_grad_norm"),
    (["--seed", "x"], "seed"),
    (["--resume", "maybe"], "resume"),
    (["--packing", "tight"], "packing"),
    (["--refill", "prompts", "--refill_window", "3"], "refill_window"),
    (["--prompt_template", "no placeholder"], "prompt_template"),
    (["--chat_template_kwargs", "3"], "chat_template_kwargs"),
    (["--eval_samples_per_split", "{aime: 0}"], "eval_samples_per_split"),
    (["--eval_datasets", "{aime: missing.jsonl}"], "eval_datasets"),
    (["--eval_datasets", "{}"], "eval_datasets"),
    (["--max_skipped_steps", "0"], "max_skipped_steps"),
    (["--answer_check", "fuzzy"], "answer_check"),
    # what the machine lacks: errors only where it lacks them (the test command's CPU machine lacks all three)
    pytest.param(["--dtype", "float16"], "dtype", marks=pytest.mark.skipif(_HAS_CUDA, reason="CUDA present")),
    pytest.param(["--attn_implementation", "flash_attention_2"], "attn_implementation",
                 marks=pytest.mark.skipif(_HAS_CUDA and _has("flash_attn"), reason="flash-attn and CUDA present")),
    pytest.param(["--rollout_backend", "vllm"], "rollout_backend",  # vLLM lives in .venv-vllm, not the main env
                 marks=pytest.mark.skipif(_has("vllm"), reason="vLLM importable")),
    (["--output_dir", ""], "output_dir"),
    (["--output_dir", "."], "output_dir"),
    (["--dataset", "problems.txt"], "dataset"),
    (["--model_name_or_path", "no/such/model"], "model_name_or_path"),
    (["--lr"], "lr"),  # no value
    (["stray"], "stray"),

    (["--group_size", "1"], "group_size"),
    (["--algorithm", "ppo"], "algorithm"),
    (["--lr", "-1"], "lr"),
    (["--temperature", "0"], "temperature"),
    (["--top_p", "1.5"], "top_p"),
    (["--loss_agg", "sum"], "loss_agg"),
    (["--prompts_per_step", "abc"], "prompts_per_step"),
    (["--clip_low", "1.2"], "clip_low"),
    (["--dataset", "missing.jsonl"], "dataset"),
    (["--no_such_field", "3"], "no_such_field"),
    (["--pruner", "magic"], "pruner"),
    (["--prompt_prune_rate", "1.0"], "prompt_prune_rate"),
    (["--completion_prune_rate", "-0.1"], "completion_prune_rate"),
    (["--prune_sampling", "poisson"], "prune_sampling"),
    (["--pruner", "dppo", "--inclusion_floor", "0"], "inclusion_floor"),
    (["--pruner", "dppo", "--inclusion", "proportional", "--prune_sampling", "fixed_count"], "prune_sampling"),
    (["--pruner", "dppo", "--size_proxy", "entropy"], "size_proxy"),
    (["--pruner", "dppo", "--uniform_mix", "1.5"], "uniform_mix"),
    (["--scale_rewards", "sideways"], "scale_rewards"),
    (["--loss_normaliser", "kept"], "loss_normaliser"),
    (["--pruner", "cppo", "--loss_normaliser", "fixed"], "loss_normaliser"),  # unweighted baselines: covered only
    (["--prompt_prune_rate", "0.5"], "prompt_prune_rate"),  # pruner none would ignore it
    (["--pruner", "greso", "--completion_prune_rate", "0.5"], "completion_prune_rate"),
    (["--kl_bias_correction", "maybe"], "kl_bias_correction"),
]


@pytest.mark.parametrize("override, says", [
    (["--eval_datasets", "{dev:dev.jsonl}"], "a space after the colon"),  # YAML reads `dev:dev.jsonl` as a key
    (["--model_name_or_path", "Qwen/Qwen3-0.6B"], "a hub id is written hf:Qwen/Qwen3-0.6B"),
    (["--dataset", "openai/gsm8k"], "a hub id is written hf:openai/gsm8k"),
    (["--eval_datasets", "{dev: org/bench}"], "a hub id is written hf:org/bench"),
])
def test_the_error_says_what_to_write(capsys, tmp_path, override, says):
    """The mistakes a newcomer makes with paths and hub ids: one line that says what to write instead."""
    err = one_line_error(capsys, ["train", "--config", GRPO_YAML, "--output_dir", str(tmp_path / "run"), *override])
    assert says in err, err


def test_a_run_without_an_evaluation_set_says_so(tmp_path):
    """A data file has no held-out split of its own: the run warns, naming the field to set (it reported an empty
    accuracy without a word before)."""
    from dppo.config import TrainConfig
    from dppo.trainer import load_data

    data = ROOT / "tests" / "fixtures" / "math_train.jsonl"
    with pytest.warns(UserWarning, match="no evaluation set.*'eval_datasets'"):
        load_data(TrainConfig(output_dir=str(tmp_path), dataset=str(data)))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_data(TrainConfig(output_dir=str(tmp_path), dataset=str(data),
                              eval_datasets={"dev": str(data.parent / "math500.jsonl")}))


def test_a_config_file_without_a_run_folder_runs_under_runs(tmp_path):
    """output_dir defaults to runs/<the config file's name> (no run lands in a results folder it did not name)."""
    from dppo.config import TrainConfig

    cfg = tmp_path / "my_dppo.yaml"
    cfg.write_text("pruner: dppo\nprompt_prune_rate: 0.5\n")
    assert TrainConfig.load(cfg).output_dir == "runs/my_dppo"
    assert TrainConfig.load(cfg, {"output_dir": str(tmp_path / "x")}).output_dir == str(tmp_path / "x")
    assert TrainConfig().output_dir == "runs/run"


def test_missing_config_file(capsys):
    assert "nope.yaml" in one_line_error(capsys, ["train", "--config", "nope.yaml"])


def test_empty_dataset_file(capsys, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    err = one_line_error(capsys, ["train", "--dataset", str(empty), "--output_dir", str(tmp_path / "run")])
    assert "empty.jsonl" in err and "no records" in err


@pytest.mark.parametrize("override, field", BAD_FIELDS,
                         ids=[" ".join((o.values if hasattr(o, "values") else o)[0]) or "empty" for o in BAD_FIELDS])
def test_bad_field(capsys, tmp_path, monkeypatch, override, field):
    monkeypatch.chdir(tmp_path)  # '.' and relative paths resolve inside the test's folder (restored after)
    err = one_line_error(capsys, ["train", "--config", GRPO_YAML, "--output_dir", str(tmp_path / "run"), *override])
    assert field in err, err


def test_output_dir_is_a_file_or_under_one(capsys, tmp_path):
    f = write(tmp_path / "afile", "x")
    assert "is a file" in one_line_error(capsys, ["train", "--output_dir", f, *TINY])
    assert "cannot be created" in one_line_error(capsys, ["train", "--output_dir", f + "/run", *TINY])


def test_model_folder_without_config(capsys, tmp_path):
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "notamodel" / "readme.txt").write_text("hi")
    err = one_line_error(capsys, ["train", "--model_name_or_path", str(tmp_path / "notamodel"),
                                  "--output_dir", str(tmp_path / "run"), *TINY])
    assert "not a model directory" in err
    err = one_line_error(capsys, ["eval", "--model", str(tmp_path / "notamodel")])
    assert "not a model directory" in err


def test_hub_model_offline(tmp_path):
    r = subprocess.run([sys.executable, "-m", "dppo.cli", "train", "--model_name_or_path", "hf:nobody/no-such-model",
                        "--output_dir", str(tmp_path / "run"), *TINY], capture_output=True, text=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("dppo: error:")]
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(errors) == 1 and "no-such-model" in errors[0]


def test_override_text_stays_text(tmp_path):
    """A text field keeps what was typed: '{question}' templates are not read as YAML mappings."""
    from dppo.cli import _overrides

    assert _overrides(["--prompt_template", "Q: {question}"]) == {"prompt_template": "Q: {question}"}
    assert _overrides(["--output_dir", "123"]) == {"output_dir": "123"}
    from dppo.config import TrainConfig

    cfg = TrainConfig.load(None, _overrides(["--lr", "1e-3", "--resume=false", "--chat_template_kwargs",
                                             "{enable_thinking: false}"]))
    assert (cfg.lr, cfg.resume, cfg.chat_template_kwargs) == (1e-3, False, {"enable_thinking": False})


def test_train_help_lists_every_field():
    from dppo.config import TrainConfig

    out = subprocess.run([sys.executable, "-m", "dppo.cli", "train", "--help"], capture_output=True, text=True).stdout
    for name in TrainConfig.field_names():
        assert f"--{name} " in out, name
    assert "AdamW learning rate" in out


# ---------------------------------------------------------------- runs, checkpoints, the folder
@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory):
    """A finished one-step run (checkpoint step_1) whose folder the tests below copy."""
    out = tmp_path_factory.mktemp("run") / "run"
    assert main(["train", "--output_dir", str(out), "--save_every", "1", *TINY]) == 0
    return out


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("override, field", [(["--lr", "1e-2"], "lr"), (["--train_size", "12"], "train_size"),
                                             (["--pruner", "dppo", "--completion_prune_rate", "0.5"], "pruner"),
                                             (["--group_size", "4"], "group_size"),
                                             (["--max_new_tokens", "8"], "max_new_tokens")])
def test_resume_with_another_config(capsys, tmp_path, one_step_run, override, field):
    run = _copy(one_step_run, tmp_path / "run")
    before = (run / "config.yaml").read_text()
    err = one_line_error(capsys, ["train", "--output_dir", str(run), *TINY, "--max_steps", "2", *override])
    assert "cannot resume" in err and field in err and "resume: false" in err
    assert (run / "config.yaml").read_text() == before  # the folder still says what its checkpoints are


@pytest.mark.parametrize("field", ["prompt_prune_rate", "completion_prune_rate", "prune_sampling"])
def test_a_pruning_field_changed_on_resume_is_an_error(capsys, tmp_path, field):
    """A DPPO run's pruning fields set its masks' distribution: a resume that changes one stops with one line naming
    it (not declared resumable: docs/reference.md's table is generated from the declarations, so this behaviour is
    tested here, not by the page)."""
    dppo = ["--pruner", "dppo", "--prompt_prune_rate", "0.5", "--completion_prune_rate", "0.5",
            "--prune_sampling", "bernoulli"]
    run = tmp_path / "run"
    assert main(["train", "--output_dir", str(run), "--save_every", "1", *TINY, *dppo]) == 0
    other = {"prompt_prune_rate": "0.3", "completion_prune_rate": "0.3", "prune_sampling": "fixed_count"}[field]
    changed = [*dppo[:dppo.index(f"--{field}") + 1], other, *dppo[dppo.index(f"--{field}") + 2:]]
    err = one_line_error(capsys, ["train", "--output_dir", str(run), *TINY, "--max_steps", "2", *changed])
    assert "cannot resume" in err and field in err


def test_resume_with_other_data(capsys, tmp_path):
    data = write(tmp_path / "d.jsonl", "".join(json.dumps({"question": f"{i}+1?", "answer": str(i + 1)}) + "\n"
                                               for i in range(6)))
    args = ["train", "--dataset", data, "--output_dir", str(tmp_path / "run"), *TINY, "--save_every", "1"]
    assert main(args) == 0
    write(tmp_path / "d.jsonl", "".join(json.dumps({"question": f"{i}+2?", "answer": str(i + 2)}) + "\n"
                                        for i in range(6)))
    assert "training data differ" in one_line_error(capsys, args[:-2] + ["--max_steps", "2"])


def test_every_checkpoint_corrupt(capsys, tmp_path, one_step_run):
    run = _copy(one_step_run, tmp_path / "run")
    for f in (run / "checkpoints").glob("step_*/model.safetensors"):
        f.write_bytes(f.read_bytes()[:1000])
    err = one_line_error(capsys, ["train", "--output_dir", str(run), *TINY, "--max_steps", "2"])
    assert "no checkpoint" in err and "truncated" in err


def test_folder_in_use(capsys, tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run = tmp_path / "run"
        run.mkdir()
        (run / ".lock").write_text(json.dumps({"pid": owner.pid, "host": os.uname().nodename}))
        err = one_line_error(capsys, ["train", "--output_dir", str(run), *TINY])
        assert "in use" in err and str(owner.pid) in err
        assert not (run / "metrics.jsonl").exists()  # the owner's files untouched
    finally:
        owner.kill()
        owner.wait()
    assert main(["train", "--output_dir", str(run), *TINY]) == 0  # a dead owner's lock is taken over
    assert not (run / ".lock").exists()  # and released at the end


def test_eval_of_a_checkpoint_and_of_nonsense(capsys, tmp_path, one_step_run):
    ckpt = next((one_step_run / "checkpoints").glob("step_*"))
    assert main(["eval", "--model", str(ckpt), *TINY[2:8]]) == 0  # a checkpoint evaluates like a model folder
    from safetensors.torch import load_file

    from dppo.model import load_policy

    model, _ = load_policy(str(ckpt))  # the run's last checkpoint holds its final weights
    final, own = load_file(one_step_run / "final" / "model.safetensors"), model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in final.items())
    capsys.readouterr()
    assert "not a local directory" in one_line_error(capsys, ["eval", "--model", str(tmp_path / "nothing")])


# ---------------------------------------------------------------- reproduce.sh parses before it installs
@pytest.mark.parametrize("args, says", [(["--study"], "--study needs a value"), (["--bogus"], "unknown option"),
                                        (["-f", "missing.yaml"], "not found"), (["--profile", "gpu"], "--profile"),
                                        (["--study", "nonsense"], "--study must be one of"),
                                        (["--train", "missing.yaml"], "not found"),
                                        (["--profile"], "--profile needs a value"),
                                        (["--toy"], "--toy goes with --profile paper"),
                                        (["--profile", "paper", "--toy", "--dry-run"], "without --dry-run"),
                                        pytest.param(["--profile", "paper"], "needs NVIDIA GPUs", marks=pytest.mark.skipif(
                                            _HAS_CUDA, reason="GPUs present: the paper profile would start"))])
def test_reproduce_flags(tmp_path, args, says):
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # a bootstrap here would fail loudly: it must not start
    r = subprocess.run(["bash", str(ROOT / "reproduce.sh"), *args], capture_output=True, text=True, env=env,
                       timeout=30)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_reproduce_help_is_the_header_and_nothing_else():
    r = subprocess.run(["bash", str(ROOT / "reproduce.sh"), "--help"], capture_output=True, text=True, timeout=30)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines and all(ln.startswith("#") for ln in lines), r.stdout
    assert any("--toy" in ln for ln in lines) and any("--lab" in ln for ln in lines)
