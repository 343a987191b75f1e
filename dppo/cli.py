"""Command line: `dppo train --config FILE [--field value ...]`, `dppo eval`, `dppo build-model`.

Errors in the user's input print one line (`dppo: error: ...`) and exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import textwrap
import warnings

import yaml

from dppo.config import ConfigError, TrainConfig
from dppo.errors import MissingDependency
from dppo.runfiles import RunError, RunWarning


def _overrides(pairs: list[str]) -> dict:
    """['--group_size', '4', '--algorithm=dapo'] -> {'group_size': 4, 'algorithm': 'dapo'}: each value read by its
    field's type (a text field keeps the text as written; numbers, booleans and mappings are read as YAML)."""
    kinds = {f.name: str(f.type) for f in dataclasses.fields(TrainConfig)}
    out, i = {}, 0
    while i < len(pairs):
        tok = pairs[i]
        if not tok.startswith("--"):
            raise ConfigError(f"unexpected argument {tok!r}; overrides are written --field value")
        key, eq, val = tok[2:].partition("=")
        if not eq:
            if i + 1 >= len(pairs):
                raise ConfigError(f"override --{key} needs a value")
            val, i = pairs[i + 1], i + 1
        key = key.replace("-", "_")
        if key not in kinds:
            raise ConfigError(f"unknown config field {key!r} (see dppo train --help)")
        if kinds[key] == "str":
            out[key] = val
        else:
            try:
                out[key] = yaml.safe_load(val) if val != "" else None
            except yaml.YAMLError:
                raise ConfigError(f"config field '{key}' got {val!r}, which is not a {kinds[key]}") from None
        i += 1
    return out


def _fields_help() -> str:
    """Every TrainConfig field with its type, default and help text (for `dppo train --help`)."""
    lines = ["config fields (YAML keys; any of them as --field value):"]
    for f in dataclasses.fields(TrainConfig):
        choices = f.metadata.get("choices")
        kind = "|".join(map(str, choices)) if choices else str(f.type)
        lines.append(f"  --{f.name} {kind}  (default {f.default!r})")
        lines += textwrap.wrap(f.metadata.get("help", ""), 100, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


def cmd_train(args, rest) -> int:
    from dppo.trainer import Trainer

    cfg = TrainConfig.load(args.config, _overrides(rest))
    trainer = Trainer(cfg)
    acc = trainer.fit()
    if trainer.is_main:  # under accelerate launch: one line, not one per rank
        print(json.dumps({"final_eval": acc}))
    return 0


def cmd_eval(args, rest) -> int:
    import dataclasses

    import torch

    from dppo.data import model_prompts
    from dppo.evaluation import evaluate, format_accuracy
    from dppo.model import load_policy
    from dppo.rollout import engine_from_config
    from dppo.trainer import load_data

    cfg = TrainConfig.load(args.config, _overrides(rest)).check_machine()
    model, tok = load_policy(args.model or cfg.model_name_or_path, cfg.dtype, cfg.attn_implementation)
    model.to("cuda" if torch.cuda.is_available() else "cpu")  # inference only: weights in the compute dtype
    _, evals = load_data(cfg)
    evals = {k: model_prompts(v, tok, cfg.chat_template, cfg.chat_template_kwargs) for k, v in evals.items()}
    if args.model:
        cfg = dataclasses.replace(cfg, model_name_or_path=args.model)
    engine = engine_from_config(cfg, model, tok, [p.prompt for v in evals.values() for p in v])
    acc = evaluate(engine, evals, cfg.eval_samples, cfg.eval_temperature, cfg.max_new_tokens, seed=cfg.seed,
                   k_per_split=cfg.eval_samples_per_split, answer_check=cfg.answer_check,
                   answer_format=cfg.answer_format)
    print(f"pass@1 (%): {format_accuracy(acc)}")
    print(json.dumps(acc))
    return 0


def cmd_build_model(args, rest) -> int:
    from dppo.model import embedded_model_dir, ship_embedded

    if args.ship:
        print(*ship_embedded(), sep="\n")
    else:
        print(embedded_model_dir(args.model, rebuild=args.rebuild))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dppo", description="Dynamic Pruning Policy Optimization")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train a policy from a YAML config (--field value overrides any field)",
                       epilog=_fields_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML file of TrainConfig fields")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("eval", help="Pass@1 of a model on the config's eval splits")
    p.add_argument("--config", help="YAML file of TrainConfig fields")
    p.add_argument("--model", help="model to evaluate (default: the config's model_name_or_path)")
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser("build-model", help="find (shipped or cached) or build the embedded model and print its path")
    p.add_argument("--rebuild", action="store_true", help="build it locally even if a shipped or cached copy exists")
    p.add_argument("--ship", action="store_true",
                   help="rebuild both embedded models and replace the package's shipped copies in dppo/embedded/")
    p.add_argument("--model", default="embedded", choices=["embedded", "embedded-large"],
                   help="which embedded model (embedded-large: twice the depth, for table T3)")
    p.set_defaults(func=cmd_build_model)
    args, rest = parser.parse_known_args(argv)
    warnings.showwarning = _one_line_warning
    try:
        return args.func(args, rest)
    except (ConfigError, RunError, MissingDependency) as e:
        print(f"dppo: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # data/model errors raised with a user-facing one-line message
        if "\n" in str(e) or not str(e):
            raise
        print(f"dppo: error: {e}", file=sys.stderr)
        return 2


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """dppo's own warnings as `dppo: warning: ...` (one line); other libraries' as Python prints them."""
    if issubclass(category, (RunWarning, UserWarning)) and "dppo" in filename:
        print(f"dppo: warning: {message}", file=sys.stderr)
    else:
        print(warnings.formatwarning(message, category, filename, lineno, line), file=sys.stderr, end="")


if __name__ == "__main__":
    sys.exit(main())
