"""A GRPOTrainer rig for the tests that compare with the real TRL (tests/test_trl.py, tests/test_losses.py): fixed
completions in place of the generation backend (only it), and TRL's two float32 computations inside a float64 model
(its log-prob kernel, transformers' Qwen3RMSNorm) in float64, for comparisons to 1e-9."""

import torch
import trl.trainer.utils
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
from trl.trainer.utils import split_tensor_dict


class Float64LogProbs:
    """TRL's fused log-prob kernel's contract (per-token log-prob of the target and entropy of
    softmax(softcap(scale hidden W^T) / T)), computed in float64 by autograd: what the kernel computes in float32."""

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size, softcap=None, logit_scale=1.0,
              outputs=("entropy",)):
        z = (hidden @ weight.t() + (0 if bias is None else bias)) * logit_scale
        if softcap is not None:
            z = softcap * torch.tanh(z / softcap)
        logp = (z / temperature).log_softmax(-1)
        entropy = -(logp.exp() * logp).sum(-1) if "entropy" in outputs else None
        return logp.gather(-1, targets[:, None]).squeeze(-1), entropy, None, None, None


def rms_norm_float64(self, hidden):
    """Qwen3RMSNorm.forward in the input's dtype (transformers normalises in float32)."""
    return self.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


G = 3  # completions per prompt
SPG = GA = 2  # steps_per_generation = gradient_accumulation_steps: one optimizer step per generation batch
# each prompt's G completions (token ids; 1 is the embedded tokenizer's EOS, the others end truncated) and rewards:
# groups with 2 completion candidates (|A| below the group's mean |A|) and one zero-variance group (all 3 candidates)
COMPLETIONS = {0: ([[11, 12, 13, 1], [14, 15, 1], [16, 17, 18, 19, 20]], [1.0, 0.0, 0.0]),
               1: ([[21, 22, 1], [23, 1], [24, 25, 26, 27]], [0.0, 0.0, 0.0]),
               2: ([[31, 32, 33], [34, 35, 36, 37, 1], [38, 1]], [1.0, 1.0, 0.0]),
               3: ([[41, 42, 43, 44], [45, 1], [46, 47, 48]], [0.0, 1.0, 0.0])}
REWARDS = {tuple(c): r for comps, rs in COMPLETIONS.values() for c, r in zip(comps, rs)}
# sampling log-probs of each completion's tokens, as vLLM would return them (fixed, varied per token)
LOGPROBS = {tuple(c): [-0.15 * ((t + len(c)) % 4) - 0.02 for t in range(len(c))]
            for comps, _ in COMPLETIONS.values() for c in comps}


def table_reward(prompts, completions, completion_ids, **kwargs):
    return [REWARDS[tuple(ids)] for ids in completion_ids]


def fixed_generation(trainer, tokenizer, prompts, logprobs: bool | dict = False):
    """Replace the generation backend (only it) by the table above: row k of a group gets completion k (and, with
    `logprobs`, its sampling log-probs, as TRL's vLLM backend returns them: LOGPROBS, or the given table)."""
    table = logprobs if isinstance(logprobs, dict) else LOGPROBS
    by_prompt = {tuple(tokenizer(p)["input_ids"]): key for key, p in enumerate(prompts)}

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        seen, out = {}, []
        for ids in prompt_ids:
            key = by_prompt[tuple(ids)]
            out.append(list(COMPLETIONS[key][0][seen.get(key, 0)]))
            seen[key] = seen.get(key, 0) + 1
        return out, [list(table[tuple(c)]) for c in out] if logprobs else None
    trainer._generate_single_turn = generate


def make_trainer(cls, cfg_cls, model, tok, data, tmp, rows_per_device, logprobs=False, reward_funcs=table_reward,
                 **kw):
    kw = {"steps_per_generation": SPG, "gradient_accumulation_steps": GA, "max_completion_length": 8, **kw}
    args = cfg_cls(output_dir=str(tmp), use_cpu=True, bf16=False, num_generations=G, report_to="none",
                   per_device_train_batch_size=rows_per_device, save_strategy="no", seed=0, **kw)
    trainer = cls(model=model, reward_funcs=reward_funcs, args=args, train_dataset=data, processing_class=tok)
    if trainer.ref_model is not None:
        trainer.ref_model.double()
    fixed_generation(trainer, tok, list(data["prompt"]), logprobs)
    trainer.model.train()
    return trainer


def batch_gradient(trainer, output) -> torch.Tensor:
    """Sum of the gradients of the generation batch's micro-batches, in order (one optimizer step when
    steps_per_generation = gradient_accumulation_steps; the sum of its steps' gradients otherwise)."""
    trainer.model.zero_grad()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    for mb in split_tensor_dict(output, trainer.args.steps_per_generation):
        trainer._compute_loss(trainer.model, mb).backward()
    return torch.cat([p.grad.reshape(-1) for p in trainer.model.parameters() if p.grad is not None]).clone()


PROMPTS = ["What is 2 + 3?", "What is 7 - 4?", "What is 6 * 2?", "What is 9 / 3?"]


def sampling_logprobs(model, tokenizer, keys, shift: float = 0.1) -> dict:
    """Sampling log-probs near the model's own (as an inference engine's would be): each completion token's log-prob
    under `model` given its prompt, moved by +-shift (alternating by token), and by -1.2 per token for every prompt's
    last completion, so that its importance ratios exp(old - sampling) exceed TRL's clip (3): e^1.2 per token."""
    table = {}
    for key in keys:
        prompt = tokenizer(PROMPTS[key])["input_ids"]
        for i, c in enumerate(COMPLETIONS[key][0]):
            with torch.no_grad():
                logits = model(torch.tensor([prompt + c])).logits[0, len(prompt) - 1:-1]
            logp = logits.log_softmax(-1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
            table[tuple(c)] = [float(x) + (-1.2 if i == G - 1 else shift * (-1) ** t) for t, x in enumerate(logp)]
    return table


def rows(keys, batch_no=None):
    out = [{"prompt": PROMPTS[k], **({"dppo_index": k, "dppo_batch": batch_no} if batch_no is not None else {})}
           for k in keys for _ in range(G)]
    return out


def float64_numerics(monkeypatch) -> None:
    """TRL's log-prob kernel and Qwen3's RMSNorm in float64 for the test (both compute in float32 as shipped)."""
    monkeypatch.setattr(trl.trainer.utils, "_ChunkedLogProbFunction", Float64LogProbs)
    monkeypatch.setattr(Qwen3RMSNorm, "forward", rms_norm_float64)
