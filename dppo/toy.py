"""The paper profile at toy scale (`./reproduce.sh --profile paper --toy`; docs/engineering.md §4.5).

Everything the toy changes is written in `experiments/paper/toy.yaml` and applied here, in three places only:
`apply` (each training run's config: hub models -> a random-init tiny Qwen3 built locally, hub data -> the
fixtures, the fields listed there), `study_params` (each study's papermill parameters: launch through torchrun,
1 or 2 processes, smaller T5 grid and F3 / F4 sizes; paper_figures reads them too, to find what the studies trained)
and `root` (results and figures under the toy root). The switch is the environment variable
`DPPO_TOY=1`, which reproduce.sh sets for the notebooks it runs and the runs they launch inherit.

    python -m dppo.toy params <study>   the study's papermill parameters under the toy (YAML, on stdout)
    python -m dppo.toy root             the toy root
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from dppo.studies import ROOT, paper_params

SPEC_FILE = ROOT / "experiments" / "paper" / "toy.yaml"
# A Qwen3-style chat template for the toy tokenizer: a user turn, then the assistant's, with Qwen3's empty thinking
# block when the caller passes enable_thinking=False (what the paper YAMLs' chat_template_kwargs do).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


def active() -> bool:
    """Whether this process runs under the toy (DPPO_TOY=1)."""
    return os.environ.get("DPPO_TOY") == "1"


def spec() -> dict:
    return yaml.safe_load(SPEC_FILE.read_text())


def root() -> Path:
    """The toy's results root (DPPO_TOY_ROOT, else toy.yaml's `root`, from the repository)."""
    return Path(os.environ.get("DPPO_TOY_ROOT") or ROOT / spec()["root"])


def _merge(base: dict, extra: dict) -> dict:
    """`base` with `extra` over it; mappings merge key by key."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def study_params(study: str) -> dict:
    """The papermill parameters of `study` under the toy: experiments/paper/<study>.yaml, then toy.yaml's
    `every_study` (for studies that launch runs) and `studies[study]`."""
    params, toy = paper_params(study), spec()
    if "launch" in params:
        params = _merge(params, toy.get("every_study", {}))
    return _merge(params, (toy.get("studies") or {}).get(study, {}))


def model_dir(repo: str) -> Path:
    """The toy stand-in for hub model `repo` (`hf:<id>`): a Qwen3ForCausalLM with random weights (seed 0) of the size
    toy.yaml gives, with the embedded tokenizer and a Qwen3-style chat template; built once under the toy root
    (atomic rename: concurrent builders never see a half-written folder)."""
    from dppo.model import EMBEDDED_SPEC, build_untrained

    sizes = spec()["models"][repo]
    out = root() / "models" / repo.removeprefix("hf:").replace("/", "--")
    made = out / "toy.json"
    if made.is_file() and json.loads(made.read_text()) == {"stands_for": repo, "sizes": sizes}:
        return out
    model, tok = build_untrained({**EMBEDDED_SPEC, "arch": {**EMBEDDED_SPEC["arch"], "max_position_embeddings": 4096,
                                                            **sizes}}, seed=0)
    tok.chat_template = CHAT_TEMPLATE
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".build-"))
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    (tmp / "toy.json").write_text(json.dumps({"stands_for": repo, "sizes": sizes}))
    shutil.rmtree(out, ignore_errors=True)
    try:
        tmp.rename(out)
    except OSError:  # another process built it meanwhile: the same weights (seed 0)
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def apply(cfg):
    """`cfg` (a TrainConfig) as the toy runs it: toy.yaml's `fields`, its hub model replaced by the local stand-in
    (`model_dir`) and every hub data source by its local file. A hub source toy.yaml does not list is an error
    naming it."""
    from dppo.config import ConfigError

    toy = spec()

    def local(src: str, field: str) -> str:
        if not str(src).startswith("hf:"):
            return src
        if src not in toy["data"]:
            raise ConfigError(f"config field {field!r}: the toy has no local copy of {src!r} (add it to {SPEC_FILE} data)")
        return str(ROOT / toy["data"][src])

    model = cfg.model_name_or_path
    if model.startswith("hf:"):
        if model not in toy["models"]:
            raise ConfigError(f"config field 'model_name_or_path': the toy has no stand-in for {model!r} (add it to "
                              f"{SPEC_FILE} models)")
        model = str(model_dir(model))
    evals = {k: local(v, f"eval_datasets.{k}") for k, v in cfg.eval_datasets.items()} if cfg.eval_datasets else None
    return dataclasses.replace(cfg, **toy["fields"], model_name_or_path=model, dataset=local(cfg.dataset, "dataset"),
                               eval_datasets=evals).validate()


def main(argv: list[str]) -> int:
    if argv[:1] == ["params"] and len(argv) == 2:
        sys.stdout.write(yaml.safe_dump(study_params(argv[1]), sort_keys=False))
        return 0
    if argv == ["root"]:
        print(root())
        return 0
    print("usage: python -m dppo.toy params <study> | root", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
