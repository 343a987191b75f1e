"""What one update measures (`dppo.trainer.Trainer.update`), kept as sums and counts so that adding micro-batches,
minibatches, epochs and ranks is exact: every mean is taken once, in `UpdateStats.metrics`."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class UpdateStats:
    """Sums over an update. `merge` adds two (micro-batches of one rank, or ranks: `merged`): each field is a sum,
    so the result does not depend on how the work was split. Values every rank measures alike (an optimizer step's
    global gradient norm, the steps taken and skipped) are added over ranks too and divided by `ranks`."""

    ranks: int = 1  # processes whose stats were added
    optimizer_steps: int = 0  # optimizer steps taken or skipped (each rank's count)
    skipped_steps: int = 0  # of them, skipped for a non-finite gradient
    grad_norm_sum: float = 0.0  # global gradient norm, summed over optimizer steps
    loss_sum: float = 0.0  # each micro-batch's loss (its share of its minibatch's loss), summed
    slots: int = 0  # token slots processed, padding included
    loss_tokens: int = 0  # completion tokens in the loss (x ppo_epochs)
    real_tokens: int = 0  # prompt and completion tokens, padding excluded
    flops: dict[str, float] = field(default_factory=dict)  # FLOPs by phase (old_logprob, ref_logprob, update)
    diagnostics: dict[str, list[float]] = field(default_factory=dict)  # name -> [sum, count] (losses' diagnostics)

    def add_diagnostics(self, sums: dict[str, list[float]] | dict[str, tuple[float, float]]) -> None:
        """Add {name: (sum, count)} (`losses.policy_objective`'s diagnostics, or the update's own)."""
        for name, (total, count) in sums.items():
            acc = self.diagnostics.setdefault(name, [0.0, 0.0])
            acc[0] += total
            acc[1] += count

    def add_flops(self, phase: str, flops: float) -> None:
        self.flops[phase] = self.flops.get(phase, 0.0) + flops

    def merge(self, other: UpdateStats) -> UpdateStats:
        """self + other of one rank (its minibatches), field by field (a new value; neither is changed)."""
        out = UpdateStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)
                             if f.name not in ("ranks", "flops", "diagnostics")}, ranks=self.ranks)
        for stats in (self, other):
            for phase, value in stats.flops.items():
                out.add_flops(phase, value)
            out.add_diagnostics(stats.diagnostics)
        return out

    @staticmethod
    def merged(parts: list[UpdateStats]) -> UpdateStats:
        """The sum of every rank's stats (in rank order), counting the ranks."""
        out = parts[0]
        for part in parts[1:]:
            out = out.merge(part)
        out.ranks = sum(part.ranks for part in parts)
        return out

    def metrics(self, ppo_epochs: int, update_seconds: float) -> dict[str, float]:
        """The update's metrics.jsonl entries: the loss and gradient norm averaged over optimizer steps, each
        diagnostic over what it counts (tokens or rows), the tokens trained once per epoch, densities per slot."""
        steps = max(1, self.optimizer_steps // self.ranks)
        return {"loss": self.loss_sum / steps,
                **{name: total / max(count, 1.0) for name, (total, count) in self.diagnostics.items()},
                "grad_norm": self.grad_norm_sum / self.ranks / steps,
                "skipped_updates": self.skipped_steps // self.ranks,
                "tokens/trained": self.loss_tokens // ppo_epochs,
                "density/valid_token": self.real_tokens / max(1, self.slots),
                "density/loss_token": self.loss_tokens / max(1, self.slots),
                "throughput/update_tokens_per_s": self.loss_tokens / max(1e-9, update_seconds)}
