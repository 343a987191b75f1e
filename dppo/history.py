"""Per-prompt history, updated after every rollout of a prompt; read by the prompt stage (docs/method.md
§2.3), by GRESO, by step composition (§3.1) and by the token-mean normaliser (§2.6). Saved in and restored
from checkpoints (plain JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class PromptRecord:
    visits: int = 0
    last_step: int = -1
    reward_mean: float = 0.0
    reward_std: float = 0.0
    zero_variance: bool = False  # all G rewards equal at the last visit
    mean_abs_adv: float = 0.0
    mean_size: float = 0.0  # mean gradient-size proxy of the completions at the last visit (|A| if none was used)
    mean_length: float = 0.0  # mean completion length (tokens) at the last visit
    easy_streak: int = 0  # most recent consecutive all-correct visits (GRESO's z for easy prompts)
    hard_streak: int = 0  # most recent consecutive all-wrong visits


class PromptHistory:
    """{prompt key: PromptRecord}; never-seen prompts have no record."""

    def __init__(self):
        self.records: dict[int, PromptRecord] = {}

    def get(self, key: int) -> PromptRecord | None:
        return self.records.get(key)

    def update(self, key: int, rewards: list[float], abs_adv: list[float], lengths: list[int], step: int,
               max_reward: float = 1.0, sizes: list[float] | None = None) -> None:
        """Record one rollout of prompt `key`: its G rewards, |A|, completion lengths and (when the completion
        stage used one) gradient-size proxies."""
        g = len(rewards)
        mean = sum(rewards) / g
        std = (sum((r - mean) ** 2 for r in rewards) / max(1, g - 1)) ** 0.5
        rec = self.records.setdefault(key, PromptRecord())
        zero_var = max(rewards) == min(rewards)
        all_correct = zero_var and mean >= max_reward
        all_wrong = zero_var and not all_correct
        rec.visits += 1
        rec.last_step = step
        rec.reward_mean, rec.reward_std, rec.zero_variance = mean, std, zero_var
        rec.mean_abs_adv = sum(abs_adv) / g
        rec.mean_size = sum(sizes) / g if sizes is not None else rec.mean_abs_adv
        rec.mean_length = sum(lengths) / g
        rec.easy_streak = rec.easy_streak + 1 if all_correct else 0
        rec.hard_streak = rec.hard_streak + 1 if all_wrong else 0

    def mean_length(self, default: float) -> float:
        """Mean completion length over all recorded prompts (`default` before any rollout)."""
        seen = [r.mean_length for r in self.records.values()]
        return sum(seen) / len(seen) if seen else default

    def estimated_lengths(self, keys: list[int], default: float) -> list[float]:
        """len_q: a prompt's mean completion length at its last visit; never seen: mean_length(default)."""
        fallback = self.mean_length(default)
        return [self.records[k].mean_length if k in self.records else fallback for k in keys]

    def state_dict(self) -> dict:
        return {str(k): asdict(v) for k, v in self.records.items()}

    def load_state_dict(self, state: dict) -> None:
        self.records = {int(k): PromptRecord(**{"mean_size": v["mean_abs_adv"], **v}) for k, v in state.items()}
