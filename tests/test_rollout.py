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


# The exactness checks below run the model in float64: KV-cached decoding, left padding and a full forward round
# differently, by an amount that depends on the CPU's kernels and thread count (a few 1e-6 in fp32, close to a 1e-5
# bound); in float64 the only rounding left is the sampler storing log-probs as float32, <= 2^-24 |log p| (~2e-6 at
# |log p| = 30), while a wrong position, cache row or temperature moves log-probs by 1e-2 or more.


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_equal_recomputed(embedded64, temperature):
    """Same weights, same tokens: the rollout's log-probs equal the trainer's recomputed ones."""
    model, tok = embedded64
    for seed in range(3):
        torch.manual_seed(seed)
        prompt = make_train(1, seed=seed)[0].prompt  # one prompt, 16 samples: no padding in generate
        assert _worst_logprob_gap(model, tok, [prompt], temperature, n=16) <= 1e-5


def test_sampling_logprobs_with_left_padding(embedded64):
    """Prompts of different lengths are left-padded in one generate call: the same log-probs."""
    model, tok = embedded64
    problems = make_train(12, seed=5)
    prompts = [p.prompt for p in problems]
    assert len({len(tok(p)["input_ids"]) for p in prompts}) > 1
    assert _worst_logprob_gap(model, tok, prompts, 0.7) <= 1e-5


def test_completion_logprobs_ignore_padding_and_batch_composition(embedded64):
    model, tok = embedded64
    p = [tok("Ann has 3 pens. How many pens does Ann have now?\nAnswer:\n")["input_ids"], [5, 6, 7]]
    c = [[9, 10, 11, tok.eos_token_id], [12]]
    with torch.no_grad():
        both = completion_logprobs(model, p, c, tok.pad_token_id)
        alone = [completion_logprobs(model, [p[i]], [c[i]], tok.pad_token_id) for i in range(2)]
    assert torch.allclose(both[0], alone[0][0], atol=1e-10)
    assert torch.allclose(both[1, :1], alone[1][0], atol=1e-10) and torch.all(both[1, 1:] == 0)


def test_top_k_1_sampling_equals_greedy_generate(embedded64):
    """top_k = 1 leaves one token, so the sampler must reproduce transformers' greedy `generate` token for token:
    left padding, position ids, the shared prompt prefill (cache repeated per completion) and the rows dropped
    from the batch and the KV cache as they finish all have to be right for every row to match. In float64, so
    that no near-tie between the two best tokens (fp32 rounding of two kernel paths) can decide a row."""
    from transformers import GenerationConfig

    model, tok = embedded64
    prompts = [p.prompt for p in make_train(6, seed=11)]
    batch = HFRollout(model, tok, batch_size=64).generate(prompts, SamplingParams(n=3, top_k=1, max_new_tokens=40))
    lengths = {len(c) for c in batch.completion_ids}
    assert len(lengths) > 1, "rows should finish at different steps"
    for r, (p_ids, c_ids) in enumerate(zip(batch.prompt_ids, batch.completion_ids)):
        with torch.no_grad():
            g = model.generate(input_ids=torch.tensor([p_ids]), generation_config=GenerationConfig(
                do_sample=False, max_new_tokens=40, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
        assert g[0, len(p_ids):].tolist()[:len(c_ids)] == c_ids, f"row {r}"
        assert batch.truncated[r] == (c_ids[-1] != tok.eos_token_id)


STOP = "\n"  # the embedded model writes one line per step of a solution


def test_stop_strings_end_each_completion_at_the_first_token_holding_one(embedded64):
    """stop_strings (a base model's one-line answers): a completion ends with the first token whose text holds a stop
    string (`stop_token_ids`: every such token of the vocabulary, and EOS), which is its last token, as EOS is. top_k
    = 1 against transformers' greedy `generate` given every stop token as an end-of-sequence id: the same tokens row
    for row, no stop token before a row's last, `truncated` only for rows that hit max_new_tokens without one; and
    the stop mattered (rows end at a stop token where they would have gone on)."""
    from transformers import GenerationConfig

    from dppo.rollout import stop_token_ids

    model, tok = embedded64
    stops = stop_token_ids(tok, [STOP])
    texts = tok.batch_decode([[i] for i in range(len(tok))])
    assert stops[0] == tok.eos_token_id and sorted(stops[1:]) == [i for i, t in enumerate(texts)
                                                                  if STOP in t and i != tok.eos_token_id]
    prompts = [p.prompt for p in make_train(6, seed=11)]
    batch = HFRollout(model, tok, 64, stop_strings=[STOP]).generate(prompts, SamplingParams(n=2, top_k=1,
                                                                                            max_new_tokens=40))
    plain = HFRollout(model, tok, 64).generate(prompts, SamplingParams(n=2, top_k=1, max_new_tokens=40))
    cut = 0
    for r, (p_ids, c_ids) in enumerate(zip(batch.prompt_ids, batch.completion_ids)):
        with torch.no_grad():
            g = model.generate(input_ids=torch.tensor([p_ids]), generation_config=GenerationConfig(
                do_sample=False, max_new_tokens=40, eos_token_id=stops, pad_token_id=tok.pad_token_id))
        assert g[0, len(p_ids):].tolist()[:len(c_ids)] == c_ids, f"row {r}"
        assert not set(c_ids[:-1]) & set(stops) and batch.truncated[r] == (c_ids[-1] not in stops), f"row {r}"
        assert plain.completion_ids[r][:len(c_ids)] == c_ids  # the same greedy path, ended earlier or not at all
        cut += len(c_ids) < len(plain.completion_ids[r])
    assert cut > 0


def test_sample_from_draws_the_distribution():
    """Inverse-CDF sampling: frequencies match softmax(logp) (5 sigma), excluded (-inf) tokens never come up."""
    from dppo.rollout import sample_from

    torch.manual_seed(0)
    logp = torch.log_softmax(torch.randn(1, 12), dim=-1)
    logp[0, [3, 7]] = float("-inf")
    draws = 200_000
    counts = torch.bincount(sample_from(logp.expand(draws, -1)), minlength=12).double()
    p = torch.softmax(logp[0].double(), dim=-1)
    assert counts[3] == 0 and counts[7] == 0
    sigma = (draws * p * (1 - p)).sqrt().clamp(min=1)
    assert ((counts - draws * p).abs() <= 5 * sigma).all()


@pytest.mark.parametrize("top_k,top_p", [(0, 0.9), (5, 1.0), (5, 0.7), (0, 0.3)])
def test_filter_logits_equals_transformers_warpers(top_k, top_p):
    from transformers import LogitsProcessorList, TopKLogitsWarper, TopPLogitsWarper

    from dppo.rollout import filter_logits

    torch.manual_seed(1)
    logp = torch.log_softmax(torch.randn(64, 50) * 3, dim=-1)
    warpers = LogitsProcessorList(([TopKLogitsWarper(top_k)] if top_k else [])
                                  + ([TopPLogitsWarper(top_p)] if top_p < 1 else []))
    expected = warpers(None, logp.clone())
    assert torch.equal(torch.isinf(filter_logits(logp, top_k, top_p)), torch.isinf(expected))


def test_in_place_kv_layer_equals_dynamic_layer():
    """`InPlaceLayer` returns exactly what transformers' concatenating `DynamicLayer` returns: prefill, single-token
    steps past its room (5 + 2 positions, then it grows), row selection (repeat and drop), and the sequence length
    that masks are built from."""
    from transformers.cache_utils import DynamicLayer

    from dppo.rollout import InPlaceLayer

    torch.manual_seed(0)
    ours, ref = InPlaceLayer(room=2), DynamicLayer()
    select = {1: torch.tensor([0, 0, 1, 2, 2]), 3: torch.tensor([1, 3, 4])}  # after step t: repeat, then drop rows
    rows, length = 3, 0
    for t, new in enumerate([5, 1, 1, 1, 1, 1]):
        k, v = torch.randn(rows, 2, new, 4), torch.randn(rows, 2, new, 4)
        got, want = ours.update(k, v), ref.update(k.clone(), v.clone())
        length += new
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[0].shape[2] == length
        assert ours.get_seq_length() == ref.get_seq_length() == length
        if t in select:
            for layer in (ours, ref):
                layer.batch_select_indices(select[t])
            rows = len(select[t])
