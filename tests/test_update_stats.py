"""An update's statistics (dppo.update_stats.UpdateStats) are sums and counts, so adding micro-batches and ranks is
exact and the means are taken once. The two-process run (tests/test_distributed.py) gathers them for real."""

import pickle

from dppo.update_stats import UpdateStats


def _rank(kl_sum: float, kl_tokens: float, loss: float, norms: list[float], skipped: int, tokens: int) -> UpdateStats:
    """One rank's update: an optimizer step per gradient norm (the global norm: every rank sees the same), its share
    of the loss, the KL summed over its tokens."""
    stats = UpdateStats(optimizer_steps=len(norms), skipped_steps=skipped, grad_norm_sum=sum(norms), loss_sum=loss,
                        slots=4 * tokens, loss_tokens=tokens, real_tokens=2 * tokens)
    stats.add_diagnostics({"kl": (kl_sum, kl_tokens)})
    stats.add_flops("update", 10.0 * tokens)
    return stats


def test_merging_ranks_is_exact_and_takes_each_mean_once():
    """Rank 0 scored 1 token (KL 1), rank 1 three (KL 9): the update's KL is 10 / 4 = 2.5, not the mean of the
    ranks' means (2); both ranks took the same 2 optimizer steps (norms 1 and 2, one skipped): the update's is 1.5
    and 1 skipped, not summed over ranks; the loss is the sum of the ranks' shares over the 2 steps."""
    a, b = _rank(1.0, 1.0, 0.25, [1.0, 2.0], 1, 1), _rank(9.0, 3.0, 0.75, [1.0, 2.0], 1, 3)
    both = UpdateStats.merged(pickle.loads(pickle.dumps([a, b])))  # as all_gather carries them
    m = both.metrics(ppo_epochs=1, update_seconds=2.0)
    assert both.ranks == 2 and m["kl"] == 2.5
    assert m["grad_norm"] == 1.5 and m["skipped_updates"] == 1
    assert m["loss"] == (0.25 + 0.75) / 2
    assert m["tokens/trained"] == 4 and m["density/loss_token"] == 0.25 and m["density/valid_token"] == 0.5
    assert m["throughput/update_tokens_per_s"] == 2.0
    assert both.flops == {"update": 40.0}
    # the split does not matter: one rank that did all the work reports the same
    whole = _rank(10.0, 4.0, 1.0, [1.0, 2.0], 1, 4)
    assert whole.metrics(1, 2.0) == m
    # merging leaves its inputs as they were (a rank's own stats may still be read)
    assert a.metrics(1, 2.0)["kl"] == 1.0 and a.ranks == 1


def test_an_update_that_trained_nothing_reports_zeros():
    m = UpdateStats().metrics(ppo_epochs=2, update_seconds=0.0)
    assert m == {"loss": 0.0, "grad_norm": 0.0, "skipped_updates": 0, "tokens/trained": 0, "density/valid_token": 0.0,
                 "density/loss_token": 0.0, "throughput/update_tokens_per_s": 0.0}


def test_a_ranks_minibatches_add_up_without_counting_as_ranks():
    """Two optimizer steps of one rank (norms 1 and 3, the second skipped) merged as the update merges its
    minibatches: the mean norm is 2 and one step was skipped (counting each minibatch as a rank halved both)."""
    first, second = _rank(1.0, 1.0, 0.5, [1.0], 0, 2), _rank(3.0, 1.0, 0.5, [3.0], 1, 2)
    update = UpdateStats().merge(first).merge(second)
    m = update.metrics(ppo_epochs=1, update_seconds=1.0)
    assert update.ranks == 1 and m["grad_norm"] == 2.0 and m["skipped_updates"] == 1 and m["loss"] == 0.5
