"""Rollout: sampling log-probs equal the trainer's recomputed log-probs for the same weights."""

import pytest
import torch

from dppo.rollout import HFRollout, SamplingParams
from dppo.scoring import completion_logprobs
from dppo.task import make_train


def _worst_logprob_gap(model, tok, prompts, temperature, n=4):
    batch = HFRollout(model, tok, batch_size=64).generate(
        prompts, SamplingParams(n=n, temperature=temperature, max_new_tokens=48, logprobs=True))
    assert all(c[-1] == tok.eos_token_id or t for c, t in zip(batch.completion_ids, batch.truncated))
    with torch.no_grad():  # the trainer's padded scoring pass
        recomputed = completion_logprobs(model, batch.prompt_ids, batch.completion_ids, tok.pad_token_id, temperature)
    assert all(torch.all(recomputed[i, len(lp):] == 0) for i, lp in enumerate(batch.logprobs))
    return max((recomputed[i, : len(lp)] - lp).abs().max().item() for i, lp in enumerate(batch.logprobs))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_equal_recomputed(embedded, temperature):
    """Same weights, same tokens: the rollout's log-probs equal the trainer's to 1e-5 (fp32) at
    temperature 1. KV-cached decoding rounds the logits differently from one full forward (a few
    1e-6 here); log-probs of logits / T carry that difference times 1/T."""
    model, tok = embedded
    for seed in range(3):
        torch.manual_seed(seed)
        prompt = make_train(1, seed=seed)[0].prompt  # one prompt, 16 samples: no padding in generate
        assert _worst_logprob_gap(model, tok, [prompt], temperature, n=16) <= 1e-5 / temperature


def test_sampling_logprobs_with_left_padding(embedded):
    """Prompts of different lengths are left-padded in one generate call; the padded kernel path
    changes fp32 rounding (not the distribution), by at most a few 1e-5 at temperature 0.7."""
    model, tok = embedded
    problems = make_train(12, seed=5)
    prompts = [p.prompt for p in problems]
    assert len({len(tok(p)["input_ids"]) for p in prompts}) > 1
    assert _worst_logprob_gap(model, tok, prompts, 0.7) <= 5e-5


def test_completion_logprobs_ignore_padding_and_batch_composition(embedded):
    model, tok = embedded
    p = [tok("Ann has 3 pens. How many pens does Ann have now?\nAnswer:\n")["input_ids"], [5, 6, 7]]
    c = [[9, 10, 11, tok.eos_token_id], [12]]
    with torch.no_grad():
        both = completion_logprobs(model, p, c, tok.pad_token_id)
        alone = [completion_logprobs(model, [p[i]], [c[i]], tok.pad_token_id) for i in range(2)]
    assert torch.allclose(both[0], alone[0][0], atol=1e-5)
    assert torch.allclose(both[1, :1], alone[1][0], atol=1e-5) and torch.all(both[1, 1:] == 0)
