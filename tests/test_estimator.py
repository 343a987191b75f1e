"""Exact unbiasedness through the real training update (docs/method.md §2.5-2.6): every mask outcome of
`prune_step` is enumerated with its probability, each outcome's kept rows go through `Trainer.update`, and
the probability-weighted mean of the gradients it computes equals the gradient of the full-batch loss, to
1e-9, for every aggregation (token-mean included), both sampling modes, each stage and both, both
normalisers, GSPO, the (bias-corrected) KL and TRL's reward scalings. Float64 model; the clipped ratio
binds (old log-probs are perturbed) and the KL acts (the reference model is perturbed)."""

import dataclasses

import pytest
import torch
from masks import enumerate_draws

from dppo.config import TrainConfig
from dppo.history import PromptHistory
from dppo.losses import ADVANTAGES
from dppo.model import build_untrained
from dppo.pruning import DPPO, prune_step
from dppo.rollout import RolloutBatch
from dppo.trainer import Timer, Trainer

B, G = 3, 3
REWARDS = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])  # 3 + 2 + 2 completion candidates
LAST_LENGTHS = {0: 6, 1: 9}  # prompts 0 and 1 had zero-variance groups when last seen: prompt candidates


class Captured(Exception):
    pass


def _rms_norm_in_input_dtype(self, hidden_states):
    """Qwen3RMSNorm without its float32 round trip, whose rounding would make float64 gradients depend on the
    loss scale at 1e-8 (the estimator is exact; this makes the arithmetic exact enough to show it at 1e-9)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """A Trainer on a tiny random Qwen3 (float64), off-policy (old log-probs perturbed per token, so clips
    bind), with a perturbed reference model (so the KL and its gradient are non-zero)."""
    from transformers.models.qwen3 import modeling_qwen3

    from dppo.model import EMBEDDED_SPEC

    patch = pytest.MonkeyPatch()
    patch.setattr(modeling_qwen3.Qwen3RMSNorm, "forward", _rms_norm_in_input_dtype)

    spec = {**EMBEDDED_SPEC, "arch": {**EMBEDDED_SPEC["arch"], "hidden_size": 32, "intermediate_size": 64,
                                      "num_hidden_layers": 1, "head_dim": 16}}
    model, tok = build_untrained(spec, seed=3)
    path = tmp_path_factory.mktemp("tiny_policy")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    cfg = TrainConfig(output_dir=str(tmp_path_factory.mktemp("run")), model_name_or_path=str(path), train_size=8,
                      eval_size=2, prompts_per_step=2, group_size=G, max_new_tokens=16, ppo_epochs=2, kl_coef=0.05,
                      max_grad_norm=0.0, warmup_steps=0)
    tr = Trainer(cfg)
    tr.model.double()
    tr.ref_model.double()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for p in tr.ref_model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    real = tr.logprobs_no_grad

    def perturbed_old(model, p_ids, c_ids, *shares, **kw):
        out, flops = real(model, p_ids, c_ids, *shares, **kw)
        if model is tr.model:  # a deterministic function of the row: the same for a row however it was kept
            for n, c in enumerate(c_ids):
                out[n, :len(c)] += 0.4 * torch.cos(1.7 * torch.tensor(c, dtype=out.dtype) + len(p_ids[n]))
        return out, flops
    tr.logprobs_no_grad = perturbed_old

    def capture(*args, **kwargs):  # the first optimizer step's gradient is grad L_hat (params never move)
        raise Captured(torch.cat([p.grad.reshape(-1).clone() for p in tr.model.parameters()]))
    tr.opt.step = capture
    yield tr
    patch.undo()


def _rollouts(vocab: int):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (int(torch.randint(4, 9, (1,), generator=g)),), generator=g).tolist()
               for _ in range(B)]
    comps = [[torch.randint(3, vocab, (int(torch.randint(2, 15, (1,), generator=g)),), generator=g).tolist()
              for _ in range(G)] for _ in range(B)]
    return prompts, comps


def _history():
    h = PromptHistory()
    for k, length in LAST_LENGTHS.items():
        h.update(k, [1.0 - k] * G, [0.0] * G, [length] * G, step=0)
    return h


def _gradient(tr, prompts, comps, keys, rows, adv, weights, normaliser):
    """Trainer.update's gradient on the kept `rows` of the rollouts of `keys`."""
    batch = RolloutBatch([prompts[k] for k in keys for _ in range(G)], [c for k in keys for c in comps[k]],
                         [torch.zeros(1)] * (len(keys) * G), [""] * (len(keys) * G), [False] * (len(keys) * G))
    try:
        tr.update(batch, rows, adv, weights, normaliser, Timer())
    except Captured as c:
        return c.args[0]
    raise AssertionError("update made no optimizer step")


CASES = [  # (loss_agg, sampling, r_q, r_o, extra config)
    *[(agg, mode, rq, ro, {}) for agg in ("seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean")
      for mode in ("bernoulli", "fixed_count") for rq, ro in ((0.5, 0.0), (0.0, 0.5), (0.5, 0.5))],
    ("token-mean", "bernoulli", 0.5, 0.5, {"loss_normaliser": "fixed"}),
    ("seq-mean-token-mean", "fixed_count", 0.5, 0.5, {"loss_normaliser": "fixed"}),
    ("seq-mean-token-mean", "bernoulli", 0.5, 0.5, {"loss_type": "gspo", "clip_low": 3e-4, "clip_high": 4e-4}),
    ("seq-mean-token-sum-norm", "bernoulli", 0.5, 0.5, {"scale_rewards": "none", "kl_bias_correction": False}),
    ("token-mean", "bernoulli", 0.0, 0.7, {"scale_rewards": "batch"}),  # batch std: exact without prompt pruning
    ("seq-mean-token-mean", "bernoulli", 0.3, 0.7, {"kl_coef": 0.0}),
    ("token-mean", "bernoulli", 0.5, 0.5, {"packing": "shared", "pack_capacity": 64}),  # shared-prompt rows
    # proportional inclusion (§2.10): without KL the zero-advantage rows are dropped with pi = 0, exactly
    ("seq-mean-token-mean", "bernoulli", 0.5, 0.5, {"kl_coef": 0.0, "inclusion": "proportional"}),
    ("token-mean", "bernoulli", 0.3, 0.7, {"kl_coef": 0.0, "inclusion": "proportional", "packing": "shared",
                                           "pack_capacity": 64}),
]


def _logit_grad(lengths: torch.Tensor) -> torch.Tensor:
    """[B, G, 2] sizes for the proportional rule's logit proxies, fixed by construction (any positive sizes keep it
    exact; these vary with the row, as real ones do)."""
    vary = 1 + (torch.arange(lengths.numel()) % 3).view_as(lengths)
    return torch.stack([0.4 * lengths * vary, (0.1 * lengths).sqrt() * vary], -1).double()


def _expected_and_full(tr, agg, mode, rq, ro, extra, kept_token_normaliser=False, counts_tokens=None):
    """(E[gradient of Trainer.update over every mask outcome], gradient of the full-batch loss); the full-batch Z
    counts tokens for token-mean (or when `counts_tokens` says so), completions otherwise."""
    settings = {"loss_type": "ppo_clip", "clip_low": 0.2, "clip_high": 0.28, "kl_bias_correction": True,
                "scale_rewards": "group", "loss_normaliser": "covered", **extra}
    tr.cfg = dataclasses.replace(tr.cfg, loss_agg=agg, **settings)
    tr.plan = dataclasses.replace(tr.plan, packing=tr.cfg.packing, capacity=tr.cfg.pack_capacity)  # planned at init
    prompts, comps = _rollouts(tr.policy.config.vocab_size)
    lengths = torch.tensor([[len(c) for c in comps[k]] for k in range(B)])
    history = _history()
    pruner = DPPO(prompt_prune_rate=rq, completion_prune_rate=ro, prune_sampling=mode, inclusion=tr.cfg.inclusion,
                  kl_coef=tr.cfg.kl_coef, kl_estimate=0.2, loss_agg=agg)
    keys = list(range(B))
    logit_grad = _logit_grad(lengths)

    def one_outcome():
        step = prune_step(pruner, keys, history, lambda ks: (REWARDS[ks], lengths[ks], logit_grad[ks]), torch.Generator(),
                          group_size=G, scale_rewards=settings["scale_rewards"], loss_agg=agg,
                          loss_normaliser=settings["loss_normaliser"], prompts_per_step=tr.cfg.prompts_per_step)
        if not len(step.rows):
            return torch.zeros(sum(p.numel() for p in tr.model.parameters()), dtype=torch.float64)
        z = float(step.lengths.reshape(-1)[step.rows].sum()) if kept_token_normaliser else step.normaliser
        return _gradient(tr, prompts, comps, step.rolled, step.rows.tolist(), step.advantages.reshape(-1),
                         step.weights, z)
    outcomes = enumerate_draws(one_outcome)
    assert len(outcomes) > 1
    expected = sum(p * g for p, g in outcomes)

    # the full-batch loss: every completion of every covered prompt, weight 1, normaliser from its definition
    may_be_pruned = [k in LAST_LENGTHS and rq > 0 for k in keys]
    if agg == "token-mean" if counts_tokens is None else counts_tokens:  # rolled-out tokens; a prompt that may be
        # pruned counts G x its last length
        z = sum(G * LAST_LENGTHS[k] if may_be_pruned[k] else float(lengths[k].sum()) for k in keys)
    else:
        z = B * G
    if settings["loss_normaliser"] == "fixed":
        z *= tr.cfg.prompts_per_step / B
    adv = ADVANTAGES[settings["scale_rewards"]](REWARDS, tr.cfg.adv_eps).reshape(-1)
    full = _gradient(tr, prompts, comps, keys, list(range(B * G)), adv, torch.ones(B * G, dtype=torch.float64), z)
    return expected, full


@pytest.mark.parametrize("agg,mode,rq,ro,extra", CASES)
def test_expected_update_gradient_equals_full_gradient(trainer, agg, mode, rq, ro, extra):
    expected, full = _expected_and_full(trainer, agg, mode, rq, ro, extra)
    assert float((expected - full).norm() / full.norm()) < 1e-9


def test_a_new_aggregation_is_one_registered_entry(trainer):
    """An aggregation registered here, touching no other file (verl's seq-mean-token-sum: l_n = sum_t l_t, Z
    counting completions; the same sum under a second name with Z counting tokens, which is token-mean's formula):
    the config accepts both, and through prune_step and Trainer.update each is exactly unbiased with both stages
    (the first with proportional inclusion too). Registered with the other normaliser rule, the check fails:
    pruning reads the rule from the entry (an estimator that branched on the name 'token-mean' fails the
    token-counting one)."""
    from dppo.losses import AGGREGATIONS, register_aggregation

    def seq_mean_token_sum(token_loss, mask, sample_weight, normaliser, max_len=0):
        return (sample_weight.to(token_loss.dtype) * (token_loss * mask).sum(dim=1)).sum() / normaliser

    try:
        for name, tokens in (("seq-mean-token-sum", False), ("token-sum-over-tokens", True)):
            register_aggregation(name, counts_tokens=tokens, divides_by_length=False)(seq_mean_token_sum)
            TrainConfig(loss_agg=name).validate()
            for extra in ({}, *([{"kl_coef": 0.0, "inclusion": "proportional"}] if not tokens else [])):
                expected, full = _expected_and_full(trainer, name, "bernoulli", 0.5, 0.5, extra, counts_tokens=tokens)
                assert float((expected - full).norm() / full.norm()) < 1e-9, (name, extra)
            register_aggregation(name, counts_tokens=not tokens, divides_by_length=False)(seq_mean_token_sum)
            expected, full = _expected_and_full(trainer, name, "bernoulli", 0.0, 0.5, {}, counts_tokens=tokens)
            assert float((expected - full).norm() / full.norm()) > 1e-3, name
    finally:
        for name in ("seq-mean-token-sum", "token-sum-over-tokens"):
            AGGREGATIONS.pop(name, None)


@pytest.mark.parametrize("mode", ["bernoulli", "fixed_count"])
def test_kept_token_normaliser_is_biased(trainer, mode):
    """The same check catches the rule dppo used before (token-mean divided by the tokens of the kept rows):
    with completion pruning alone its expected gradient is a multiple of the full one, well above 1."""
    expected, full = _expected_and_full(trainer, "token-mean", mode, 0.0, 0.5, {}, kept_token_normaliser=True)
    assert float((expected - full).norm() / full.norm()) > 0.1
    assert float(expected @ full / (full @ full)) > 1.1


def test_proportional_with_kl_is_unbiased_within_monte_carlo_error(trainer):
    """With a KL term no row's loss is zero for every theta, so every row keeps pi >= the floor; too many Poisson
    masks to enumerate through the model (2^9 x 4), so 400 drawn masks: the mean gradient is within 4 standard
    errors of the full one (and pruning did drop rows: the estimate is not trivially the full gradient)."""
    tr = trainer
    tr.cfg = dataclasses.replace(tr.cfg, loss_agg="seq-mean-token-mean", loss_type="ppo_clip", clip_low=0.2,
                                 clip_high=0.28, kl_bias_correction=True, scale_rewards="group",
                                 loss_normaliser="covered", kl_coef=0.05, inclusion="proportional", packing="none")
    tr.plan = dataclasses.replace(tr.plan, packing="none")
    prompts, comps = _rollouts(tr.policy.config.vocab_size)
    lengths = torch.tensor([[len(c) for c in comps[k]] for k in range(B)])
    pruner = DPPO(prompt_prune_rate=0.5, completion_prune_rate=0.7, inclusion="proportional", inclusion_floor=0.2, kl_coef=0.05,
                  kl_estimate=0.2)
    gen, grads, kept, logit_grad = torch.Generator().manual_seed(0), [], [], _logit_grad(lengths)
    for _ in range(400):
        step = prune_step(pruner, list(range(B)), _history(), lambda ks: (REWARDS[ks], lengths[ks], logit_grad[ks]),
                          gen, group_size=G, prompts_per_step=tr.cfg.prompts_per_step)
        kept.append(len(step.rows))
        grads.append(_gradient(tr, prompts, comps, step.rolled, step.rows.tolist(), step.advantages.reshape(-1),
                               step.weights, step.normaliser) if len(step.rows) else None)
    grads = torch.stack([g if g is not None else torch.zeros_like(grads[kept.index(max(kept))]) for g in grads])
    adv = ADVANTAGES["group"](REWARDS, tr.cfg.adv_eps).reshape(-1)
    full = _gradient(tr, prompts, comps, list(range(B)), list(range(B * G)), adv,
                     torch.ones(B * G, dtype=torch.float64), B * G)
    mean, se = grads.mean(0), grads.std(0) / len(grads) ** 0.5
    assert float((mean - full).norm()) < 4 * float(se.norm())
    assert sum(kept) / len(kept) < 0.8 * B * G and float(se.norm()) < 0.5 * float(full.norm())


# ---------------------------------------------------------------- the update's absolute scale, by hand
def _hand_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """log softmax(logits / T) of each completion token, from one unpadded forward of prompt + completion.  [|o|]"""
    logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1: -1] / temperature
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def _hand_minibatch_gradient(tr, prompts, comps, rollout, mb, kept, adv, weights, normaliser):
    """Autograd of the minibatch loss written from docs/method.md §2.2, §2.5 and §2.6, not from dppo's functions:

        L_mb = sum_{n in mb} w_n l_n / (Z n_mb / n),   l_n = agg_t(c_t s_t + beta k3_t rho_t)
        s_t = -min(rho_t A_n, clip(rho_t, 1 - eps_low, 1 + eps_high) A_n),  rho_t = pi / pi_old
        c_t = min(pi_old / pi_rollout, C) (TIS),  k3_t = e^d - d - 1,  d = log pi_ref - log pi

    agg: mean over the completion's tokens, sum / max_new_tokens, or sum. Also returns each row's c_t."""
    cfg, model = tr.cfg, tr.policy
    model.zero_grad(set_to_none=True)
    total, tis = 0.0, {}
    for n in mb:
        p, c = prompts[kept[n]], comps[kept[n]]
        logp = _hand_logprobs(model, p, c, cfg.temperature)
        with torch.no_grad():  # the fixture's old policy: the current one, perturbed per token
            old = logp + 0.4 * torch.cos(1.7 * torch.tensor(c, dtype=logp.dtype) + len(p))
            ref = _hand_logprobs(tr.ref_model.policy, p, c, cfg.temperature)
        rho = torch.exp(logp - old)
        a = adv[n]
        surrogate = -torch.minimum(rho * a, torch.clamp(rho, 1 - cfg.clip_low, 1 + cfg.clip_high) * a)
        tis[n] = torch.clamp(torch.exp(old - rollout[kept[n]].double()), max=cfg.rollout_is_cap)
        d = ref - logp
        token = surrogate * tis[n] + cfg.kl_coef * (torch.exp(d) - d - 1) * rho
        per_sample = {"seq-mean-token-mean": token.mean(), "seq-mean-token-sum-norm": token.sum() / cfg.max_new_tokens,
                      "token-mean": token.sum()}[cfg.loss_agg]
        total = total + weights[n] * per_sample / (normaliser * len(mb) / len(kept))
    total.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]), tis


@pytest.mark.parametrize("packing,agg", [("none", "seq-mean-token-mean"), ("dense", "token-mean"),
                                         ("shared", "seq-mean-token-sum-norm"), ("dense", "seq-mean-token-mean")])
def test_update_gradient_equals_hand_written_loss(trainer, monkeypatch, packing, agg):
    """Trainer.update with num_minibatches = 2, off-policy, KL (bias-corrected) and TIS on, at temperature 0.8: every
    split of the kept rows into the two minibatches is enumerated, and each of the update's optimizer steps (2 inner
    epochs x 2 minibatches) gets the gradient of the hand-written minibatch loss at its absolute scale, Z n_mb / n
    included, to 1e-9 (float64); the TIS weight handed to the loss is min(pi_old / pi_rollout, C) per token, and
    the cap binds. Averaged over the splits, a minibatch's gradient is grad L_hat of all kept rows (§2.5)."""
    import itertools

    import dppo.trainer as trainer_module

    tr = trainer
    monkeypatch.setattr(tr, "cfg", dataclasses.replace(
        tr.cfg, loss_agg=agg, loss_type="ppo_clip", clip_low=0.2, clip_high=0.28, kl_bias_correction=True,
        num_minibatches=2, packing=packing, pack_capacity=40, micro_batch_tokens=40, micro_batch_size=2,
        temperature=0.8, kl_coef=0.05, rollout_is_correction="tis", rollout_is_cap=1.5))
    monkeypatch.setattr(tr, "plan", dataclasses.replace(tr.plan, packing=packing, capacity=40, token_budget=40,
                                                        micro_batch_size=2))
    prompts, comps = _rollouts(tr.policy.config.vocab_size)
    prompts = [prompts[b] for b in range(B) for _ in range(G)]
    comps = [c for group in comps for c in group]
    with torch.no_grad():  # what a rollout engine reports: float32 log-probs, off the trainer's by up to ~0.9
        rollout = [(_hand_logprobs(tr.policy, p, c, 0.8) + 0.9 * torch.sin(2.3 * torch.tensor(c) + n)).float()
                   for n, (p, c) in enumerate(zip(prompts, comps))]
    kept = [0, 2, 3, 4, 6, 8]  # rows of the batch an outcome kept, their advantages and pruning weights, Z
    adv = torch.tensor([1.2, -0.7, 0.4, -1.1, 0.9, -0.3], dtype=torch.float64)
    weights = torch.tensor([2.0, 1.0, 2.0, 1.0, 1.0, 2.0], dtype=torch.float64)
    normaliser = 7.5 if agg != "token-mean" else 61.0
    batch = RolloutBatch(prompts, comps, rollout, [""] * len(prompts), [False] * len(prompts))
    full_adv = torch.zeros(B * G, dtype=torch.float64)
    full_adv[kept] = adv

    rows, steps, tis_seen = [], [], {}  # kept rows of the current optimizer step; (rows, gradient) per step
    real_loss, real_objective = tr.micro_batch_loss, trainer_module.policy_objective

    def record_rows(mbatch, *args):
        rows[len(rows):] = [mbatch.rows]
        return real_loss(mbatch, *args)

    def record_tis(logp, old, adv_, mask, *args, token_weight=None, **kw):
        for j, n in enumerate(rows[-1]):
            tis_seen[n] = token_weight[j, : int(mask[j].sum())].detach().clone()
        return real_objective(logp, old, adv_, mask, *args, token_weight=token_weight, **kw)

    def record_step(*args, **kwargs):  # the gradient of each optimizer step; the parameters never move
        steps.append((sorted(i for idx in rows for i in idx), torch.cat([p.grad.reshape(-1).clone()
                                                                         for p in tr.model.parameters()])))
        rows.clear()
    monkeypatch.setattr(tr, "micro_batch_loss", record_rows)
    monkeypatch.setattr(trainer_module, "policy_objective", record_tis)
    monkeypatch.setattr(tr.opt, "step", record_step)

    half = (len(kept) + 1) // 2
    splits = list(itertools.combinations(range(len(kept)), half))
    mean_first = torch.zeros(())
    for first in splits:  # randperm's output such that perm[0::2] = first, perm[1::2] = the rest
        order = [0] * len(kept)
        order[0::2], order[1::2] = list(first), [i for i in range(len(kept)) if i not in first]
        monkeypatch.setattr(torch, "randperm", lambda n, generator=None, order=order, **kw: torch.tensor(order))
        steps.clear()
        tr.update(batch, kept, full_adv, weights, normaliser, Timer())
        assert [mb for mb, _ in steps] == [list(first), order[1::2]] * 2  # 2 inner epochs x 2 minibatches
        for mb, grad in steps:
            hand, tis = _hand_minibatch_gradient(tr, prompts, comps, rollout, mb, kept, adv, weights, normaliser)
            assert float((grad - hand).norm() / hand.norm()) < 1e-9
            for n in mb:
                assert torch.allclose(tis_seen[n], tis[n], rtol=1e-12, atol=0)
        mean_first = mean_first + steps[0][1] / len(splits)
    full, tis = _hand_minibatch_gradient(tr, prompts, comps, rollout, list(range(len(kept))), kept, adv, weights,
                                         normaliser)
    assert float((mean_first - full).norm() / full.norm()) < 1e-9
    capped = torch.cat([t for t in tis.values()])
    assert (capped == tr.cfg.rollout_is_cap).any() and (capped < 1).any()  # the cap binds; others correct downward
