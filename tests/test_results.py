"""Run folders reused only for what trained them (dppo.results.run): the same config and the same code."""

from dppo import results
from dppo.trainer import Trainer


def test_a_finished_run_is_reused_only_with_the_same_config_and_code(tmp_path, monkeypatch, embedded):
    out, fits = tmp_path / "run", []
    fit = Trainer.fit

    def counted(self):
        fits.append((out / "final").exists())  # whether a final/ stood when training began
        return fit(self)
    monkeypatch.setattr(Trainer, "fit", counted)
    results.run("experiments/cpu/grpo.yaml", out, smoke=True)
    assert fits == [False] and (out / "final").is_dir()
    assert (out / results.CODE_FILE).read_text().strip() == results.code_hash()
    results.run("experiments/cpu/grpo.yaml", out, smoke=True)
    assert fits == [False]  # same config, same code: reused
    results.run("experiments/cpu/grpo.yaml", out, smoke=True, lr=2e-4)
    assert fits == [False, False]  # another config: trained again, from scratch
    monkeypatch.setattr(results, "code_hash", lambda: "0" * 64)  # the package's source changed since
    results.run("experiments/cpu/grpo.yaml", out, smoke=True, lr=2e-4)
    assert fits == [False, False, False] and (out / "final").is_dir()
    assert (out / results.CODE_FILE).read_text().strip() == "0" * 64
