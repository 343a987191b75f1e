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
# each prompt's G completions (token ids) and rewards: groups with 2 completion candidates (|A| below the group's
# mean |A|) and one zero-variance group (all 3 candidates)
COMPLETIONS = {0: ([[11, 12, 13, 2], [14, 15, 2], [16, 17, 18, 19, 20]], [1.0, 0.0, 0.0]),
               1: ([[21, 22, 2], [23, 2], [24, 25, 26, 27]], [0.0, 0.0, 0.0]),
               2: ([[31, 32, 33], [34, 35, 36, 37, 2], [38, 2]], [1.0, 1.0, 0.0]),
               3: ([[41, 42, 43, 44], [45, 2], [46, 47, 48]], [0.0, 1.0, 0.0])}
REWARDS = {tuple(c): r for comps, rs in COMPLETIONS.values() for c, r in zip(comps, rs)}
# sampling log-probs of each completion's tokens, as vLLM would return them (fixed, varied per token)
LOGPROBS = {tuple(c): [-0.15 * ((t + len(c)) % 4) - 0.02 for t in range(len(c))]
            for comps, _ in COMPLETIONS.values() for c in comps}


def table_reward(prompts, completions, completion_ids, **kwargs):
    return [REWARDS[tuple(ids)] for ids in completion_ids]


def fixed_generation(trainer, tokenizer, prompts, logprobs: bool = False):
    """Replace the generation backend (only it) by the table above: row k of a group gets completion k (and, with
    `logprobs`, its sampling log-probs, as TRL's vLLM backend returns them)."""
    by_prompt = {tuple(tokenizer(p)["input_ids"]): key for key, p in enumerate(prompts)}

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        seen, out = {}, []
        for ids in prompt_ids:
            key = by_prompt[tuple(ids)]
            out.append(list(COMPLETIONS[key][0][seen.get(key, 0)]))
            seen[key] = seen.get(key, 0) + 1
        return out, [list(LOGPROBS[tuple(c)]) for c in out] if logprobs else None
    trainer._generate_single_turn = generate


def make_trainer(cls, cfg_cls, model, tok, data, tmp, rows_per_device, logprobs=False, **kw):
    args = cfg_cls(output_dir=str(tmp), use_cpu=True, bf16=False, num_generations=G, report_to="none",
                   per_device_train_batch_size=rows_per_device, steps_per_generation=SPG,
                   gradient_accumulation_steps=GA, max_completion_length=8, save_strategy="no", seed=0, **kw)
    trainer = cls(model=model, reward_funcs=table_reward, args=args, train_dataset=data, processing_class=tok)
    if trainer.ref_model is not None:
        trainer.ref_model.double()
    fixed_generation(trainer, tok, list(data["prompt"]), logprobs)
    trainer.model.train()
    return trainer


def batch_gradient(trainer, output) -> torch.Tensor:
    """Sum of the gradients of the generation batch's micro-batches, in order, as one optimizer step sees them."""
    trainer.model.zero_grad()
    trainer.current_gradient_accumulation_steps = GA
    for mb in split_tensor_dict(output, SPG):
        trainer._compute_loss(trainer.model, mb).backward()
    return torch.cat([p.grad.reshape(-1) for p in trainer.model.parameters() if p.grad is not None]).clone()


PROMPTS = ["What is 2 + 3?", "What is 7 - 4?", "What is 6 * 2?", "What is 9 / 3?"]


def rows(keys, batch_no=None):
    out = [{"prompt": PROMPTS[k], **({"dppo_index": k, "dppo_batch": batch_no} if batch_no is not None else {})}
           for k in keys for _ in range(G)]
    return out


def float64_numerics(monkeypatch) -> None:
    """TRL's log-prob kernel and Qwen3's RMSNorm in float64 for the test (both compute in float32 as shipped)."""
    monkeypatch.setattr(trl.trainer.utils, "_ChunkedLogProbFunction", Float64LogProbs)
    monkeypatch.setattr(Qwen3RMSNorm, "forward", rms_norm_float64)
