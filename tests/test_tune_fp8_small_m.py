"""The fp8 backend choice from timings (tune_fp8.small_m_pick, phase_choice), without a GPU: the
small-M kernel is taken only where it beats every other candidate at decode's M <= SMALL_M_MAX, then
in every phase, and the GEMM above it is the phase's best over the larger M alone."""
import pytest

import atom_aot.build.tune_fp8 as tune_fp8
from atom_aot.artifact.phase import Phase
from atom_aot.artifact.tuning import BackendChoice, PhaseTuning, Tuning
from atom_aot.build.measure import best_config
from atom_aot.build.tune_fp8 import SMALL_M_MAX, phase_choice, small_m_pick

ATEN, TRITON = ("aten",), ("triton", 64, 128, 128, 4, 3)
SMALL_A, SMALL_B = ("small_m", 64, 256, 1, 4, 6), ("small_m", 32, 512, 1, 4, 4)


def timings(small_ms: float):
    """aten best at M <= 16, triton best above; SMALL_A at small_ms, SMALL_B slower."""
    rows = {}
    for m in (1, 16, 64, 256):
        big = m > SMALL_M_MAX
        rows[f"down_proj {m}x4096x14336"] = {ATEN: 10.0 if not big else 30.0, TRITON: 12.0 if not big else 20.0}
    small = {f"down_proj {m}x4096x14336": {SMALL_A: small_ms, SMALL_B: small_ms * 1.5} for m in (1, 16)}
    return rows, small


def decode_choice(rows, small_rows):
    return phase_choice(rows, best_config, small_m_pick(rows, small_rows, best_config), "fp8_linear")


def test_small_m_kernel_taken_where_faster_with_thebest_config_large_gemm_above():
    choice, label = decode_choice(*timings(small_ms=6.0))
    # aten wins over all four M (geometric mean) but triton wins above M 16: the large path is triton
    assert choice == BackendChoice("small_m+triton", {"fp8_small_m": (SMALL_M_MAX, *SMALL_A[1:]),
                                                      "fp8_gemm": TRITON[1:]})
    assert "small_m 64,256,1,4,6 up to M 16" in label and "triton,64,128,128,4,3 above" in label


def test_slower_small_m_kernel_leaves_the_one_gemm():
    rows, small = timings(small_ms=11.0)
    choice, label = decode_choice(rows, small)
    assert choice == tune_fp8.as_choice(best_config(rows)) and label == ",".join(map(str, best_config(rows)))


def test_config_that_does_not_fit_is_skipped():
    rows, small = timings(small_ms=6.0)
    small[next(iter(small))][SMALL_A] = None            # OutOfResources at one shape
    choice, _ = decode_choice(rows, small)
    assert choice.params["fp8_small_m"] == (SMALL_M_MAX, *SMALL_B[1:])


@pytest.mark.parametrize("scheme", ["fp8", "fp8-block"])
def test_build_rows_use_small_m_for_decode_only(monkeypatch, scheme):
    """Through tune.py with the timings stubbed: the decode and mixed rows both name small_m+... (over
    triton for block-scaled weights, which cuBLASLt cannot run), each with its phase's best GEMM above
    (the stub's mixed shapes are all above 16 tokens), and the rows' backends can be built."""
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.tune import _with_measured_linear
    from atom_aot.models import ModelConfig
    from atom_aot.ops.backends import make_backend
    from model_factories import TINY_QWEN3
    pytest.importorskip("triton")
    rows, small = timings(small_ms=6.0)
    monkeypatch.setattr(tune_fp8, "measure_linear", lambda cfg, s, dtype, phase: {
        k: ({c: v for c, v in r.items() if s != "fp8-block" or c != ATEN}) for k, r in rows.items()
        if phase == "decode" or int(k.split()[1].split("x")[0]) > SMALL_M_MAX})
    monkeypatch.setattr(tune_fp8, "measure_small_m", lambda *a: small)
    monkeypatch.setattr(tune_fp8, "measure_silu_mul_quant", silu_measurements)
    monkeypatch.setattr(tune_fp8, "measure_rms_norm_quant", norm_measurements)
    row = PhaseTuning({"attention": BackendChoice("triton")})
    base = Tuning(arch="sm90", measured=True, phases={Phase.DECODE: row, Phase.MIXED: row}, kernels={})
    tuned = _with_measured_linear(base, BuildConfig(arch="sm90"), ModelConfig.from_hf_dict(TINY_QWEN3), scheme)
    decode = tuned.for_phase(Phase.DECODE).op("fp8_linear")
    assert decode.backend == "small_m+triton"
    mixed = tuned.for_phase(Phase.MIXED).op("fp8_linear")
    assert mixed.backend == "small_m+triton" and mixed.params["fp8_small_m"] == decode.params["fp8_small_m"]
    make_backend("fp8_linear", decode)
    make_backend("fp8_linear", mixed)
    measured = tuned.measurements_ms["fp8_linear"]["decode"]
    assert "64,256,1,4,6" in measured["chosen"]


def silu_timings(phase: str) -> dict:
    """The one-pass kernel at 16 warps fastest at decode's token counts, Inductor's kernels at the mixed phase's."""
    tokens = (1, 16, 64, 256) if phase == "decode" else (512, 2048, 8192)
    return {f"silu_mul_quant {m}x96": {("inductor",): 2.0 * m, ("triton", 8): 2.5 * m,
                                       ("triton", 16): (1.0 if phase == "decode" else 3.0) * m}
            for m in tokens}


def silu_measurements(cfg, dtype, phases, timer):
    """Stands in for tune_fp8.measure_silu_mul_quant."""
    return {phase: silu_timings(phase) for phase in phases}


def norm_measurements(cfg, dtype, phases, timer):
    """Stands in for tune_fp8.measure_rms_norm_quant: the one-pass kernel at 8 warps fastest in every phase, the
    16-warp one out of registers (None)."""
    tokens = {"decode": (1, 16, 64, 256), "mixed": (512, 2048, 8192)}
    return {phase: {f"rms_norm_quant {m}x64": {("inductor",): 2.0 * m, ("triton", 8): 1.5 * m, ("triton", 16): None}
                    for m in tokens[phase]} for phase in phases}


def test_fp8_rows_name_the_measured_row_quantizers_per_phase(monkeypatch):
    """Per-token fp8 weights: each phase's row names the faster of Inductor's kernels and the one-pass kernel
    (with its warps) for the down projection's input (silu_mul_quant) and for the qkv / gate_up projections'
    (rms_norm_quant); the backends build, inspect says which runs; other schemes (static scales, block scales)
    get no such rows."""
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.tune import _with_measured_linear
    from atom_aot.models import ModelConfig
    from atom_aot.ops.backends import make_backend
    from model_factories import TINY_QWEN3
    pytest.importorskip("triton")
    rows, small = timings(small_ms=6.0)
    monkeypatch.setattr(tune_fp8, "measure_linear", lambda cfg, s, dtype, phase: rows)
    monkeypatch.setattr(tune_fp8, "measure_small_m", lambda *a: small)
    monkeypatch.setattr(tune_fp8, "measure_silu_mul_quant", silu_measurements)
    monkeypatch.setattr(tune_fp8, "measure_rms_norm_quant", norm_measurements)
    row = PhaseTuning({"attention": BackendChoice("triton")})
    base = Tuning(arch="sm90", measured=True, phases={Phase.DECODE: row, Phase.MIXED: row}, kernels={})
    cfg = ModelConfig.from_hf_dict(TINY_QWEN3)
    tuned = _with_measured_linear(base, BuildConfig(arch="sm90"), cfg, "fp8")
    decode, mixed = (tuned.for_phase(p).op("silu_mul_quant") for p in (Phase.DECODE, Phase.MIXED))
    assert decode == BackendChoice("triton", {"silu_mul_quant": (16,)}) and mixed == BackendChoice("inductor")
    norms = [tuned.for_phase(p).op("rms_norm_quant") for p in (Phase.DECODE, Phase.MIXED)]
    assert norms == [BackendChoice("triton", {"rms_norm_quant": (8,)})] * 2
    for op, choice in (("silu_mul_quant", decode), ("silu_mul_quant", mixed), ("rms_norm_quant", norms[0])):
        make_backend(op, choice)
    assert tuned.measurements_ms["silu_mul_quant"]["decode"]["chosen"] == "triton,16"
    assert tuned.measurements_ms["rms_norm_quant"]["mixed"]["chosen"] == "triton,8"
    assert "decode: triton atom_triton::silu_mul_quant (16 warps)" in tuned.kernels["silu-mul + fp8 quant"]
    assert "mixed: triton atom_triton::add_rms_norm_quant (8 warps)" in tuned.kernels["rms-norm + fp8 quant"]
    for scheme in ("fp8-static", "fp8-block"):
        other = _with_measured_linear(base, BuildConfig(arch="sm90"), cfg, scheme)
        assert not {"silu_mul_quant", "rms_norm_quant"} & set(other.for_phase(Phase.DECODE).ops)


@pytest.mark.parametrize("small_ms", [6.0, 11.0])
def test_int8_rows_take_the_small_m_kernel_only_where_faster(monkeypatch, small_ms):
    """int8 has one GEMM (`aten`: _int_mm); the small-M kernel joins it in every phase where it beats
    it at decode's small M, under the int8 params key."""
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.tune import _with_measured_linear
    from atom_aot.models import ModelConfig
    from atom_aot.ops.backends import make_backend
    from model_factories import TINY_QWEN3
    pytest.importorskip("triton")
    rows, small = timings(small_ms)
    monkeypatch.setattr(tune_fp8, "measure_linear", lambda cfg, s, dtype, phase: {
        k: {ATEN: r[ATEN]} for k, r in rows.items() if phase == "decode" or int(k.split()[1].split("x")[0]) > 16})
    monkeypatch.setattr(tune_fp8, "measure_small_m", lambda *a: small)
    row = PhaseTuning({"attention": BackendChoice("triton")})
    base = Tuning(arch="sm90", measured=True, phases={Phase.DECODE: row, Phase.MIXED: row}, kernels={})
    tuned = _with_measured_linear(base, BuildConfig(arch="sm90"), ModelConfig.from_hf_dict(TINY_QWEN3), "int8")
    for phase in (Phase.DECODE, Phase.MIXED):
        choice = tuned.for_phase(phase).op("int8_linear")
        if small_ms < 10.0:
            assert choice == BackendChoice("small_m+aten", {"int8_small_m": (SMALL_M_MAX, *SMALL_A[1:])})
        else:
            assert choice == BackendChoice("aten")
        make_backend("int8_linear", choice)
    assert "int8 gemm" in tuned.kernels


@pytest.mark.parametrize("scheme", ["int4-w4a16", "int4-w4a16-channel"])
def test_int4_rows_take_the_small_m_kernel_with_the_int4_gemm_above(monkeypatch, scheme):
    """int4 has `aten` (dequantize, cuBLAS) and the Triton GEMM; the small-M kernel joins the best of them in
    every phase where it beats them at decode's small M, its params under `int4_small_m` and the Triton
    GEMM's under `int4_gemm` (not fp8's key); the rows' backends build. Only configs whose K step lies in one
    group of 128 are timed for grouped weights."""
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.tune import _with_measured_linear
    from atom_aot.models import ModelConfig
    from atom_aot.ops.backends import make_backend
    from model_factories import TINY_QWEN3
    pytest.importorskip("triton")
    rows, small = timings(small_ms=6.0)
    small_int4 = ("small_m", 64, 128, 2, 4, 4)
    small = {shape: {small_int4: v[SMALL_A]} for shape, v in small.items()}
    monkeypatch.setattr(tune_fp8, "measure_linear", lambda cfg, s, dtype, phase: {
        k: r for k, r in rows.items() if phase == "decode" or int(k.split()[1].split("x")[0]) > SMALL_M_MAX})
    monkeypatch.setattr(tune_fp8, "measure_small_m", lambda *a: small)
    row = PhaseTuning({"attention": BackendChoice("triton")})
    base = Tuning(arch="sm90", measured=True, phases={Phase.DECODE: row, Phase.MIXED: row}, kernels={})
    tuned = _with_measured_linear(base, BuildConfig(arch="sm90"), ModelConfig.from_hf_dict(TINY_QWEN3), scheme)
    for phase in (Phase.DECODE, Phase.MIXED):
        choice = tuned.for_phase(phase).op("int4_linear")
        assert choice == BackendChoice("small_m+triton", {"int4_small_m": (SMALL_M_MAX, *small_int4[1:]),
                                                          "int4_gemm": TRITON[1:]})
        make_backend("int4_linear", choice)
    block_ks = {c[1] for c in tune_fp8.small_m_configs(scheme)}
    assert (256 in block_ks) == (scheme == "int4-w4a16-channel") and all(128 % k == 0 for k in block_ks - {256})
