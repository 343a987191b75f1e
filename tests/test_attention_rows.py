"""Which packed layout each attention kernel gets (`dppo.packing.attention_rows`), decided from what transformers
registered under the kernel's name, never from the name: a kernel that does not separate the sequences of a row must
never get two of them in one row, whatever it is called.

Hub kernels are registered here by transformers' own `load_and_register_attn_kernel`, with `get_kernel` (a download
from the hub) replaced by a module offering what the real one offers: flash-attn's `flash_attn_varlen_func`
(kernels-community/flash-attn2, which transformers 5.25 loads for flash_attention_2 when the flash_attn package is
missing), or `flash_attn_forward` (registered with sdpa's mask builder, which such a kernel need not apply)."""

import copy
import random
import warnings
from types import SimpleNamespace

import pytest
import torch

from dppo.packing import (ONE_ROW, ONE_SEQUENCE, ROWS, MicroBatchPlan, attention_rows, pack_padded,
                          packed_completion_logprobs, packed_layout)
from dppo.scoring import completion_logprobs

pytest.importorskip("kernels")  # transformers registers hub kernels only with the kernels package (a TRL extra)

VARLEN_HUB = "kernels-community/flash-attn2"  # transformers' flash_attention_2 fallback
CAUSAL_HUB = "test-org/causal-only"  # a hub kernel with flash_attn_forward: causal per row, the mask ignored
UNKNOWN = "test-org/never-registered"
VARLEN_RENAMED = "fast-kernel"  # flash-attn's varlen kernel and mask under a name that says nothing of flash
FLASH_NAMED_SDPA = "flash_attention_sdpa"  # sdpa's kernel and mask under a flash-like name

# what each kernel does with several sequences in a row (the ground truth, from transformers' code, not dppo's rule)
EXPECTED = {"sdpa": ROWS, "eager": ROWS, "flash_attention_2": ONE_ROW, "flash_attention_3": ONE_ROW,
            "flash_attention_4": ONE_ROW, VARLEN_HUB: ONE_ROW, "flex_attention": ONE_SEQUENCE,
            "paged|eager": ONE_SEQUENCE, CAUSAL_HUB: ONE_SEQUENCE, UNKNOWN: ONE_SEQUENCE,
            VARLEN_RENAMED: ONE_ROW, FLASH_NAMED_SDPA: ROWS}  # the rule reads what is registered, never the name


def causal_only(module, query, key, value, attention_mask, **kwargs):
    """A kernel that attends causally within each row and ignores the mask (as a kernel without varlen support)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kwargs.pop("is_causal", None)
    return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)


@pytest.fixture(scope="module", autouse=True)
def hub_kernels():
    """VARLEN_HUB and CAUSAL_HUB registered as transformers registers a kernel it fetched from the hub."""
    import transformers.integrations.hub_kernels as hub

    modules = {VARLEN_HUB: SimpleNamespace(flash_attn_varlen_func=lambda *a, **k: None),
               CAUSAL_HUB: SimpleNamespace(flash_attn_forward=causal_only, supports_flash_attn=True)}
    fetch = hub.get_kernel
    hub.get_kernel = lambda repo_id, **kw: modules[repo_id]
    try:
        for name in modules:
            hub.load_and_register_attn_kernel(name)
    finally:
        hub.get_kernel = fetch
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS as masks
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as kernels

    for name, like in ((VARLEN_RENAMED, "flash_attention_2"), (FLASH_NAMED_SDPA, "sdpa")):
        kernels.register(name, kernels[like])
        masks.register(name, masks[like])


def names():
    """Every name transformers' registries hold, the hub kernels above, and a name never registered."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return sorted({*ALL_MASK_ATTENTION_FUNCTIONS, *ALL_ATTENTION_FUNCTIONS, "eager", *EXPECTED})


def rows_of(slot: torch.Tensor, width: int) -> list[set[int]]:
    """The sequences of each packed row, from pack_padded's slots ([n, T] flat index r W + c, -1 at padding)."""
    out: dict[int, set[int]] = {}
    for i in range(slot.size(0)):
        for r in set((slot[i][slot[i] >= 0] // width).tolist()):
            out.setdefault(r, set()).add(i)
    return list(out.values())


def test_every_kernel_gets_a_layout_it_scores_right():
    """For every kernel name transformers may report, in dppo's trainer (packed_layout, the update's
    MicroBatchPlan, dense and shared) and in DPPOTrainer's passes (pack_padded): two sequences share a row only under
    a kernel that separates them (sdpa, eager); a flash-attn varlen kernel, under any name, gets each micro-batch as
    one row; the names checked by hand (EXPECTED) get what their code does."""
    rng = random.Random(0)
    lengths = [rng.randint(3, 40) for _ in range(12)]
    seen = {}
    for name in names():
        seen[name] = attention_rows(name)
        kind = EXPECTED.get(name, ONE_SEQUENCE)  # a name not checked by hand: only the layout safe for any kernel
        layouts = [packed_layout(lengths, 64, seen[name])]
        for packing in ("dense", "shared"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                plan = MicroBatchPlan.for_run(packing, (seen[name], name), 64, 128, 4)
            mbs = plan.micro_batches(list(range(12)), [2] * 12, lengths, [i // 4 for i in range(12)])
            layouts += [[sum(row, []) for row in mb.layout] for mb in mbs]
            if kind == ONE_ROW:
                assert all(len(mb.layout) == 1 for mb in mbs), name
            if packing == "shared" and kind != ROWS:
                assert plan.packing == "dense", name  # a shared prompt needs the 4-D mask
        ids = torch.arange(1, 13)[:, None].repeat(1, 44)
        mask = (torch.arange(44)[None, :] < torch.tensor(lengths)[:, None]).long()
        packed, _, slot = pack_padded(ids, mask, 64, seen[name])
        trl_rows = [sorted(r) for r in rows_of(slot, packed.size(1))]  # DPPOTrainer forwards a one-row kernel's
        for layout in layouts:  # rows one a call, each within the capacity (TRL's tokens a forward)
            if kind != ROWS:
                assert all(len(row) == 1 for row in layout) or (kind == ONE_ROW and len(layout) == 1), (name, layout)
        if kind == ONE_ROW:
            assert len(layouts[0]) == 1 and all(sum(lengths[i] for i in r) <= 64 or len(r) == 1 for r in trl_rows)
        elif kind == ONE_SEQUENCE:
            assert all(len(r) == 1 for r in trl_rows), name
    assert seen == {n: EXPECTED.get(n, ONE_SEQUENCE) for n in seen}


def test_a_kernel_that_ignores_the_mask_scores_the_padded_log_probs(embedded64, monkeypatch):
    """A hub kernel registered with sdpa's mask builder but attending causally per row (CAUSAL_HUB): packed scoring
    gives the padded pass's log-probs, because each of its rows holds one sequence; a layout with several sequences a
    row is refused. That layout (what a name-based rule gave it) would be wrong: the sequences attend to each other."""
    import dppo.packing as packing
    from tests.trl_rig import float64_numerics

    float64_numerics(monkeypatch)  # every op in float64: the two layouts' rounding (~1e-16) decides nothing
    model = copy.deepcopy(embedded64[0])
    rng = random.Random(1)
    prompts = [[rng.randint(5, 200) for _ in range(rng.randint(3, 9))] for _ in range(6)]
    completions = [[rng.randint(5, 200) for _ in range(rng.randint(2, 12))] for _ in range(6)]
    want = completion_logprobs(model, prompts, completions, 0, 1.0)
    valid = torch.zeros_like(want, dtype=torch.bool)
    for i, c in enumerate(completions):
        valid[i, :len(c)] = True
    model.config._attn_implementation = CAUSAL_HUB
    got, _ = packed_completion_logprobs(model, prompts, completions, 0, 1.0, 64)
    assert float((got - want)[valid].abs().max()) < 1e-10
    several = [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="does not separate sequences"):
        packed_completion_logprobs(model, prompts, completions, 0, 1.0, 64, rows=several)
    monkeypatch.setattr(packing, "check_layout", lambda *a: None)
    wrong, _ = packed_completion_logprobs(model, prompts, completions, 0, 1.0, 64, rows=several)
    assert float((wrong - want)[valid].abs().max()) > 1e-3


def test_trl_passes_under_a_kernel_that_ignores_the_mask_equal_padded(embedded64, tmp_path, monkeypatch):
    """DPPOTrainer's packed pass (pack_sequences) under CAUSAL_HUB gives TRL's padded log-probs."""
    from dppo.trl import DPPOConfig, DPPOTrainer
    from tests.test_trl_configs import padded_batch, two_prompt_trainer
    from tests.trl_rig import COMPLETIONS, PROMPTS, float64_numerics

    float64_numerics(monkeypatch)

    model, tok = embedded64
    trainer = two_prompt_trainer(DPPOTrainer, DPPOConfig, model, tok, tmp_path, completion_prune_rate=0.5)
    trainer.model.config._attn_implementation = CAUSAL_HUB
    ids, mask, K = padded_batch(tok, [PROMPTS[k] for k in (0, 1, 2, 3, 0, 2)],
                                [list(c) for k in (0, 1) for c in COMPLETIONS[k][0]])
    completion_mask = mask[:, -K:].bool()
    with torch.no_grad():
        results = {}
        for packed in (True, False):
            trainer.args.pack_sequences = packed
            results[packed] = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, K)[0]
    assert float((results[True] - results[False])[completion_mask].abs().max()) < 1e-10
