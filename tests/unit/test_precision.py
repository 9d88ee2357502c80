"""`dtype: auto`: bf16 only where the hardware computes it (emulated bf16 ran 10x slower)."""

from __future__ import annotations

import pytest

from swerl.config import load_config
from training.precision import cpu_has_native_bf16, resolve_dtype

pytestmark = pytest.mark.unit

AVX2_EPYC = "processor\t: 0\nflags\t\t: fpu sse sse2 avx fma avx2 vaes sha_ni\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile\n"
NEOVERSE_V1 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_bf16_units_are_read_off_the_cpu_flags():
    assert not cpu_has_native_bf16(AVX2_EPYC)
    assert cpu_has_native_bf16(SAPPHIRE_RAPIDS)
    assert cpu_has_native_bf16(NEOVERSE_V1)
    assert not cpu_has_native_bf16("model name\t: bf16 marketing name\n")  # only flag lines count
    assert not cpu_has_native_bf16("")


def test_auto_follows_the_cpu_and_explicit_names_pass_through(monkeypatch):
    import training.precision as precision

    for flags, expected in ((AVX2_EPYC, "float32"), (SAPPHIRE_RAPIDS, "bfloat16")):
        resolve_dtype.cache_clear()
        monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda text=None, f=flags: cpu_has_native_bf16(f))
        assert resolve_dtype("auto") == expected
        assert resolve_dtype("bfloat16") == "bfloat16" and resolve_dtype("float32") == "float32"
    resolve_dtype.cache_clear()


def test_cpu_demo_takes_auto_and_the_config_rejects_other_names():
    cfg = load_config("cpu-demo-1turn")
    assert cfg.rollout.dtype == "auto" and cfg.rft.train.dtype == "auto" and cfg.dapo.train.dtype == "auto"
    with pytest.raises(Exception, match="rollout.dtype"):
        load_config("smoke", ["rollout.dtype=bf16"])
