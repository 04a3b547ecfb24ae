"""benchmarks/cute_candidates.py's choice of kernels: globs and a tunable family's configurations."""
from .benchmark_scripts import load


def load_script():
    return load("cute_candidates")


def test_a_configuration_id_keeps_its_commas():
    script = load_script()
    text = "triton.rms_norm,triton.rms_norm[block=4096,warps=8],liger.*,triton.rms_norm_add[block=8192,warps=16]"
    assert script.kernel_patterns(text) == [
        "triton.rms_norm", "triton.rms_norm[block=4096,warps=8]", "liger.*", "triton.rms_norm_add[block=8192,warps=16]"]


def test_configurations_are_timed_beside_the_globs_and_the_fallback():
    script = load_script()
    patterns = script.kernel_patterns("triton.rms_norm,triton.rms_norm[block=4096,warps=8],triton.rms_norm_add[block=4096,warps=8]")
    assert script.candidates("norm.rms", patterns) == [
        "eager.rms_norm", "triton.rms_norm", "triton.rms_norm[block=4096,warps=8]"]
