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
        out = real(model, p_ids, c_ids, *shares, **kw)
        if model is tr.model:  # a deterministic function of the row: the same for a row however it was kept
            for n, c in enumerate(c_ids):
                out[n, :len(c)] += 0.4 * torch.cos(1.7 * torch.tensor(c, dtype=out.dtype) + len(p_ids[n]))
        return out
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


def _expected_and_full(tr, agg, mode, rq, ro, extra, kept_token_normaliser=False):
    """(E[gradient of Trainer.update over every mask outcome], gradient of the full-batch loss)."""
    settings = {"loss_type": "ppo_clip", "clip_low": 0.2, "clip_high": 0.28, "kl_bias_correction": True,
                "scale_rewards": "group", "loss_normaliser": "covered", **extra}
    tr.cfg = dataclasses.replace(tr.cfg, loss_agg=agg, **settings)
    prompts, comps = _rollouts(tr.policy.config.vocab_size)
    lengths = torch.tensor([[len(c) for c in comps[k]] for k in range(B)])
    history = _history()
    pruner = DPPO(prompt_rate=rq, completion_rate=ro, sampling=mode, inclusion=tr.cfg.inclusion,
                  kl_coef=tr.cfg.kl_coef, kl_estimate=0.2, loss_agg=agg)
    keys = list(range(B))

    def one_outcome():
        step = prune_step(pruner, keys, history, lambda ks: (REWARDS[ks], lengths[ks]), torch.Generator(),
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
    if agg == "token-mean":  # rolled-out tokens; a prompt that may be pruned counts G x its last length
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
    prompts, comps = _rollouts(tr.policy.config.vocab_size)
    lengths = torch.tensor([[len(c) for c in comps[k]] for k in range(B)])
    pruner = DPPO(prompt_rate=0.5, completion_rate=0.7, inclusion="proportional", inclusion_floor=0.2, kl_coef=0.05,
                  kl_estimate=0.2)
    gen, grads, kept = torch.Generator().manual_seed(0), [], []
    for _ in range(400):
        step = prune_step(pruner, list(range(B)), _history(), lambda ks: (REWARDS[ks], lengths[ks]), gen,
                          group_size=G, prompts_per_step=tr.cfg.prompts_per_step)
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
