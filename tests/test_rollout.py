"""Rollout: sampling log-probs equal the trainer's recomputed log-probs for the same weights."""

import pytest
import torch

from dppo.rollout import HFRollout, SamplingParams
from dppo.scoring import batched_logprobs, completion_logprobs
from dppo.task import make_train


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_equal_recomputed(embedded, temperature):
    model, tok = embedded
    problems = make_train(12, seed=5)  # prompts of different lengths: left padding in generate
    batch = HFRollout(model, tok, batch_size=32).generate(
        [p.prompt for p in problems], SamplingParams(n=4, temperature=temperature, max_new_tokens=48))
    assert len(batch.completion_ids) == 48 and len({len(p) for p in batch.prompt_ids}) > 1
    assert all(c[-1] == tok.eos_token_id or t for c, t in zip(batch.completion_ids, batch.truncated))
    recomputed = batched_logprobs(model, batch.prompt_ids, batch.completion_ids, tok.pad_token_id, temperature,
                                  micro_batch_size=16)
    worst = max((recomputed[i, : len(lp)] - lp).abs().max().item() for i, lp in enumerate(batch.logprobs))
    assert worst <= 1e-5
    assert all(torch.all(recomputed[i, len(lp):] == 0) for i, lp in enumerate(batch.logprobs))


def test_completion_logprobs_ignore_padding_and_batch_composition(embedded):
    model, tok = embedded
    p = [tok("Ann has 3 pens. How many pens does Ann have now?\nAnswer:\n")["input_ids"], [5, 6, 7]]
    c = [[9, 10, 11, tok.eos_token_id], [12]]
    with torch.no_grad():
        both = completion_logprobs(model, p, c, tok.pad_token_id)
        alone = [completion_logprobs(model, [p[i]], [c[i]], tok.pad_token_id) for i in range(2)]
    assert torch.allclose(both[0], alone[0][0], atol=1e-5)
    assert torch.allclose(both[1, :1], alone[1][0], atol=1e-5) and torch.all(both[1, 1:] == 0)
