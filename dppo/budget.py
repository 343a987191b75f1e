"""Dry run of the reproduction: every command it would run, an estimated GPU-hour budget and the disk kept per study.

    python -m dppo.budget --profile paper [--study NAME] [--gpus 8]     (./reproduce.sh --profile paper --dry-run)
    python -m dppo.budget --profile real [--study NAME]   the real profile's runs and minutes on 2 CPU cores

The estimate is FLOPs over a stated throughput, per training run (docs/engineering.md §4.2):

    rollout   2 N x rolled tokens                      at DECODE_MFU of the peak (memory-bound decoding)
    update    update_flops_per_token x trained tokens                      at TRAIN_MFU
              = 2 N (cost.training_multiplier(gradient_checkpointing) x ppo_epochs + [old] + [ref]): 8 N a pass
              with checkpointing (the forward recomputed), 6 N without; + 2 N for the old log-probs when off-policy,
              + 2 N for the reference when kl_coef > 0
    eval      2 N x (problems x k x tokens) per evaluation                at DECODE_MFU

with N the model's parameters, tokens = PROMPT_TOKENS + max_new_tokens / 2 per sample, and pruning's expected
savings (prompt stage: half the prompts assumed zero-variance candidates, so r_q / 2 of them skipped; completion
stage: r_o of the rest). Replace the assumptions by your first steps' `throughput/*` metrics for a real plan.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import yaml

from dppo.config import PRUNER_FIELDS, TrainConfig
from dppo.cost import training_multiplier
from dppo.memory_plan import PROMPT_TOKENS, memory_table
from dppo.disk import (CHECKPOINT_BYTES_PER_PARAM, DATASET_SIZES, SAVE_DTYPE_BYTES, dataset_size,  # noqa: F401
                       disk_plan, final_bytes_per_param, free_bytes, run_disk_bytes)  # (the tests read them here too)
from dppo.studies import BY_NAME, model_params  # noqa: F401 (model_params: used below, and by the tests)

STUDIES = tuple(BY_NAME)  # the registry (dppo.studies), in reproduction order
DEFAULT_STUDIES = tuple(name for name, s in BY_NAME.items() if s.in_default_run)  # ./reproduce.sh without --study

PEAK_FLOPS = 989e12  # H100 SXM, dense BF16 tensor-core peak (NVIDIA H100 Tensor Core GPU datasheet)
TRAIN_MFU = 0.25  # assumed: NeMo AutoModel reports 28-44% MFU for BF16 FSDP2 training on DGX-H100 with TE kernels
DECODE_MFU = 0.08  # assumed: batched vLLM decoding is bound by memory bandwidth, not FLOPs
# What a study finds free on the 2-core, 24 GB machine the real profile's minutes were measured on: how many of its
# runs train in turn together, and so how many timing twins it adds (`timing_twins`).
REFERENCE_AVAILABLE_BYTES = 22 * 2 ** 30
def update_flops_per_token(cfg: TrainConfig, n_params: float) -> float:
    """FLOPs of the update per trained token (docs/engineering.md §4.2, docs/method.md §5): a forward is 2 N; a training pass is
    `cost.training_multiplier` forwards (forward + a backward of twice its cost, + the recomputed forward under
    gradient checkpointing), once per inner epoch; one more forward scores the old log-probs when the update is
    off-policy (ppo_epochs x num_minibatches > 1) and one the reference when kl_coef > 0:

        2 N (training_multiplier(gradient_checkpointing) x ppo_epochs + [off-policy] + [kl_coef > 0])"""
    off_policy = cfg.ppo_epochs * cfg.num_minibatches > 1
    passes = training_multiplier(cfg.gradient_checkpointing) * cfg.ppo_epochs + off_policy + (cfg.kl_coef > 0)
    return 2 * n_params * passes


def run_gpu_hours(cfg: TrainConfig) -> float:
    """Estimated GPU-hours of one training run (module docstring)."""
    n_params = model_params(cfg.model_name_or_path.removeprefix("hf:"))
    tokens = PROMPT_TOKENS + cfg.max_new_tokens / 2
    prompts = dataset_size(cfg.dataset, None, cfg.train_size) * cfg.epochs
    rolled = 1.0 - (cfg.prompt_prune_rate / 2 if "prompt_prune_rate" in PRUNER_FIELDS[cfg.pruner] else 0.0)
    trained = rolled * (1.0 - cfg.completion_prune_rate)
    samples = prompts * cfg.group_size
    train_flops = samples * tokens * trained * update_flops_per_token(cfg, n_params)
    rollout_flops = samples * tokens * rolled * 2 * n_params
    splits = cfg.eval_datasets or {f"level{i}": None for i in range(1, 6)} | {"ood": None}
    per_eval = sum(dataset_size(src, cfg.eval_size) if src else cfg.eval_size
                   for src in splits.values()) * cfg.eval_samples  # k per split where set
    per_eval += sum((k - cfg.eval_samples) * dataset_size(splits[s], cfg.eval_size)
                    for s, k in (cfg.eval_samples_per_split or {}).items() if splits.get(s))
    steps = prompts / cfg.prompts_per_step
    evals = steps // cfg.eval_every + 2
    eval_flops = evals * per_eval * tokens * 2 * n_params
    seconds = train_flops / (PEAK_FLOPS * TRAIN_MFU) + (rollout_flops + eval_flops) / (PEAK_FLOPS * DECODE_MFU)
    return seconds / 3600


def study_params(study: str, profile: str) -> dict:
    """The study notebook's papermill parameters under `profile` (the cpu profile: the notebook defaults)."""
    from dppo.studies import profile_params

    return profile_params(study, profile)


def _study_specs(study: str, profile: str) -> list[tuple[str, str, Path, str, TrainConfig]]:
    """(table, row label, run folder, its YAML, its config) of every run of every table a study trains, in order."""
    from dppo import studies as registry
    from dppo.results import study_root

    params = study_params(study, profile)
    layouts = registry.study_layouts(study, **registry.layout_params(params))
    seeds = params.get("seeds", registry.BY_NAME[study].seeds)
    specs = []
    for key, layout in layouts.items():
        for label, runs in registry.runs_for(layout, seeds).items():
            for cfg_path, over, sub in runs:
                out = study_root(params.get("results_dir", ""), profile=profile) / sub
                out = out.relative_to(registry.ROOT) if out.is_relative_to(registry.ROOT) else out
                specs.append((key, label, out, cfg_path,
                              TrainConfig.load(registry.ROOT / cfg_path, {**over, "output_dir": str(out)})))
    return specs


def study_runs(study: str, profile: str) -> dict[Path, tuple[str, TrainConfig]]:
    """{run folder: (its YAML, its config)} of every training run a study launches under `profile`, in order; a run
    shared between tables once (it trains once)."""
    runs: dict[Path, tuple[str, TrainConfig]] = {}
    for _, _, out, cfg_path, cfg in _study_specs(study, profile):
        runs.setdefault(out, (cfg_path, cfg))
    return runs


def timing_twins(study: str, profile: str, finished: set[Path],
                 available_bytes: float = REFERENCE_AVAILABLE_BYTES) -> int:
    """How many timing twins (`results.in_turn_chunks`: a baseline trained again beside rows it cannot train with) a
    CPU study trains when the runs in `finished` are done, with `available_bytes` free (the reference machine's);
    none on the paper profile's GPUs, where runs go one after another."""
    from dppo.results import TWIN, in_turn_chunks
    from dppo.studies import TABLES

    if profile == "paper":
        return 0
    specs = _study_specs(study, profile)
    twins, seen = 0, set(finished)
    for key in dict.fromkeys(spec[0] for spec in specs):
        for seed in dict.fromkeys(cfg.seed for k, *_, cfg in specs if k == key):
            mine = [(label, out, cfg) for k, label, out, _, cfg in specs if k == key and cfg.seed == seed]
            group = [(label, cfg) for label, out, cfg in mine if out not in seen]
            seen |= {out for _, out, _ in mine}
            chunks = in_turn_chunks(group, available_bytes, TABLES[key].baseline if key in TABLES else None,
                                    {label: cfg for label, _, cfg in mine})
            twins += sum(label.endswith(TWIN.format("")) for chunk in chunks for label, _ in chunk)
    return twins


def plan(studies: list[str], profile: str, gpus: int) -> tuple[list[str], list[dict]]:
    """(every command, in order; one budget row per study). A run an earlier study of the plan trains (T5's GRPO and
    DPPO are T4's) is counted there only: the later study finds it finished."""
    from dppo import studies as registry
    from dppo.launch import train_command
    from dppo.results import reusable, study_root

    commands, rows, seen = [], [], set()
    for study in studies:
        params = study_params(study, profile)
        args = f" -f experiments/paper/{study}.yaml" if params and profile == "paper" else \
            f" -f <python -m dppo.studies --params real {study}>" if params else ""
        commands.append(f"papermill notebooks/{study}.ipynb experiments/results/notebooks/{study}.ipynb --cwd .{args}")
        runs = {out: run for out, run in study_runs(study, profile).items() if out not in seen}
        # finished here by this code (a fresh clone: the committed run logs of the real profile): the study skips them
        reused = {out for out, (_, cfg) in runs.items() if profile != "paper" and reusable(cfg, registry.ROOT / out)}
        if study == "case_study" and profile != "paper":  # F5's seeds whose saved answers stand for their runs
            reused |= answered_runs(runs, study_root(params.get("results_dir", ""), profile=profile))
        twins = timing_twins(study, profile, seen | reused)
        seen |= set(runs)
        for out in reused:
            commands.append(f"  (finished by this code: reused) {runs[out][0]} -> {out}")
        runs = {out: run for out, run in runs.items() if out not in reused}
        hours = 0.0
        for out, (cfg_path, cfg) in runs.items():
            hours += run_gpu_hours(cfg)
            if params.get("launch"):
                commands.append("  " + shlex.join(train_command(out / "launch.yaml", params["launch"], gpus)))
            else:
                commands.append(f"  (in the notebook's process) dppo train --config {cfg_path} -> {out}")
        # on GPUs (and launched) runs train one after another; on CPU a seed's runs train in turn, together, but in a
        # study that trains its runs one at a time, each cut to its weights once done (the case study's own)
        trimmed = study in registry.ONE_AT_A_TIME
        together = profile != "paper" and not params.get("launch") and not trimmed
        by_seed: dict[object, list[TrainConfig]] = {}
        for i, (_, cfg) in enumerate(runs.values()):
            by_seed.setdefault(cfg.seed if together else i, []).append(cfg)
        disk, peak = disk_plan(list(by_seed.values()), trimmed)
        rows.append({"study": study, "runs": len(runs) + twins, "twins": twins, "reused": len(reused), "gpu_hours": hours,
                     "hours_on_gpus": hours / gpus, "disk_tb": disk / 1e12, "peak_tb": peak / 1e12,
                     "configs": list(runs.values()), "cpu_minutes": registry.BY_NAME[study].cpu_minutes})
    return commands, rows


def answered_runs(runs: dict[Path, tuple[str, TrainConfig]], root: Path) -> set[Path]:
    """The run folders of F5's seeds whose saved answers stand for their runs (`dppo.case_study.answered`): the case
    study neither trains nor samples them again."""
    from dppo import studies as registry
    from dppo.case_study import answered

    by_seed: dict[int, list[Path]] = {}
    for out, (_, cfg) in runs.items():
        by_seed.setdefault(cfg.seed, []).append(out)
    return {out for seed, outs in by_seed.items()
            if answered([(runs[out][1], registry.ROOT / out) for out in outs], seed, root) for out in outs}


def studies_at_most(rows: list[dict]) -> float:
    """TB on disk at most over studies run one after another (`plan`'s rows): those before kept beside one's peak."""
    return max((sum(q["disk_tb"] for q in rows[:i]) + r["peak_tb"] for i, r in enumerate(rows)), default=0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dppo.budget", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=("cpu", "paper", "real"), default="paper")
    parser.add_argument("--study", choices=STUDIES, action="append", help="one study (repeatable; default all)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs of the machine (wall-clock column)")
    parser.add_argument("--check-disk", metavar="FOLDER", help="print nothing and exit 0 where the studies' runs fit "
                        "in FOLDER's free space, else one line and exit 3 (./reproduce.sh checks before training)")
    args = parser.parse_args(argv)
    from dppo.studies import REAL_STUDIES, real_minutes

    default = list(REAL_STUDIES) if args.profile == "real" else list(DEFAULT_STUDIES)
    commands, rows = plan(args.study or default, args.profile, args.gpus)
    if args.check_disk:  # the studies one after another: each keeps its runs for the next (paper_figures reads them)
        most = studies_at_most(rows) * 1e12
        free = free_bytes(args.check_disk)
        if most > free:
            print(f"reproduce.sh: not enough disk in {args.check_disk!r} for {', '.join(r['study'] for r in rows)} "
                  f"({args.profile} profile): up to {most / 1e9:,.1f} GB at once by the dry run's estimate "
                  f"(./reproduce.sh --dry-run), {free / 1e9:,.1f} GB free", file=sys.stderr)
            return 3
        return 0
    print("# commands")
    print("\n".join(commands))
    if args.profile == "real":
        print("\n# time on 2 CPU cores (estimated: each study's measured minutes a run, or its own: "
              "dppo.studies.real_minutes)")
        twins = {r["study"]: f" ({r['twins']} of them timing twins)" if r["twins"] else "" for r in rows}
        reused = {r["study"]: f"; {r['reused']} finished runs reused (./reproduce.sh --retrain trains them again)"
                  if r["reused"] else "" for r in rows}
        print("\n".join(f"{r['study']:18s} {r['runs']:3d} runs ~{real_minutes(r['study'], r['runs']):.0f} min"
                        f"{twins[r['study']]}{reused[r['study']]}" for r in rows))
        total = sum(real_minutes(r["study"], r["runs"]) for r in rows)
        print(f"{'total':18s} {sum(r['runs'] for r in rows):3d} runs ~{total:.0f} min (+ paper_figures, under a minute)")
        return 0
    if args.profile == "cpu":
        print("\n# time on 2 CPU cores (measured: dppo.studies.Study.cpu_minutes)")
        print("\n".join(f"{r['study']:18s} ~{r['cpu_minutes']:g} min" for r in rows))
        print(f"{'total':18s} ~{sum(r['cpu_minutes'] for r in rows):.0f} min (+ paper_figures, under a minute)")
        left = [s for s in STUDIES if s not in DEFAULT_STUDIES and s not in (args.study or [])]
        if left:
            print("not in ./reproduce.sh --profile cpu without --study: " + ", ".join(
                f"{s} (~{BY_NAME[s].cpu_minutes:g} min: ./reproduce.sh --study {s})" for s in left))
        return 0
    print(f"\n# estimated budget ({args.profile} profile; H100 bf16 peak {PEAK_FLOPS / 1e12:.0f} TFLOP/s at "
          f"{TRAIN_MFU:.0%} MFU for updates, {DECODE_MFU:.0%} for decoding; dppo.budget states the assumptions)")
    print(f"| study | training runs | GPU-hours | hours on {args.gpus} GPUs | disk kept (TB) | disk at most (TB) |")
    print("|---|---:|---:|---:|---:|---:|")
    kept = 0.0
    for r in rows:
        print(f"| {r['study']} | {r['runs']} | {r['gpu_hours']:,.0f} | {r['hours_on_gpus']:,.1f} | {r['disk_tb']:,.2f} "
              f"| {kept + r['peak_tb']:,.2f} |")
        kept += r["disk_tb"]
    total = sum(r["gpu_hours"] for r in rows)
    print(f"| **total** | {sum(r['runs'] for r in rows)} | {total:,.0f} | {total / args.gpus:,.1f} | {kept:,.2f} | "
          f"{studies_at_most(rows):,.2f} |")
    print("\n" + "\n".join(memory_table([c for r in rows for c in r["configs"]], args.gpus)))
    print(f"\ndisk per run: final/ (4 bytes per parameter, 2 with save_dtype bfloat16) + keep_checkpoints x "
          f"{CHECKPOINT_BYTES_PER_PARAM} (fp32 weights and AdamW state) while it trains, one more while a new one is "
          f"written; kept after final/ only with keep_checkpoints_after_final. 'At most': the studies before it kept "
          f"plus this one's peak")
    return 0


if __name__ == "__main__":
    sys.exit(main())
