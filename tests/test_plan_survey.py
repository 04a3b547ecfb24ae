"""benchmarks/plan_survey.py --patch: a tiny random model of a type, patched in each table state, must
compute what it did; the check must catch a patch that changes the model."""

import pytest

from .benchmark_scripts import load


@pytest.fixture(scope="module")
def survey():
    return load("plan_survey")


def test_a_tiny_model_is_the_default_config_shrunk(survey):
    config = survey.tiny_config("gemma3_text")
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size, config.head_dim) == (64, 2, 128, 16)
    assert sorted(config.layer_types) == ["full_attention", "sliding_attention"], "both kinds of layer kept"


def test_a_patched_tiny_model_agrees_in_every_state(survey, tiny_llama_artifact, restore_active):
    assert survey.check_patched("qwen3", str(tiny_llama_artifact)) == ("patch agrees", "none, fallbacks, others, foreign")


def test_the_other_kernels_state_locks_ops_to_kernels_that_are_not_their_fallback(survey):
    from runtime_loader.ops import OPS

    locks = survey.state_dispatcher("others", None).policy.lock
    assert locks["norm.rms"] != OPS["norm.rms"].fallback and locks["linear"] != OPS["linear"].fallback


def state_of(d) -> str:
    from runtime_loader.ops import OPS

    lock = d.policy.lock
    return "none" if not lock else "fallbacks" if all(k == OPS[op].fallback for op, k in lock.items()) else "others"


@pytest.mark.parametrize("state", ["none", "fallbacks", "others"])
def test_a_patch_that_changes_the_model_is_caught(survey, state, monkeypatch, restore_active):
    """A patch that, in one state, replaced the LM head's forward (zero logits): that state fails."""
    import torch

    import runtime_loader.integrations.transformers as integration

    patch = integration.patch

    def changing(model, d, **kw):
        report = patch(model, d, **kw)
        if state_of(d) == state:
            model.get_output_embeddings().forward = lambda x: torch.zeros(*x.shape[:-1], 128)
        return report

    monkeypatch.setattr(integration, "patch", changing)
    status, problems = survey.check_patched("llama", None)
    assert status == "PATCH DISAGREES", (status, problems)
    assert {p.split(":")[0] for p in problems.split("; ")} == {state}, problems
    assert ("changed the model with no table" in problems) == (state == "none")
