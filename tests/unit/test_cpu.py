"""engine.machine.cpu: a CPU's kind from its flags and what `--precision auto` tries on each kind
(flags faked: each kind the team has met, docs/performance.md)."""

import pytest

from engine.machine.cpu import AUTO_PRECISIONS, CpuKind

pytestmark = pytest.mark.unit

AVX2_EPYC = {"avx", "avx2", "fma", "f16c"}  # AMD EPYC Zen 3
ZEN4_EPYC = AVX2_EPYC | {"avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}
AMX_XEON = ZEN4_EPYC | {"amx_tile", "amx_int8", "amx_bf16", "avx_vnni"}  # Sapphire Rapids and later
VNNI_ONLY = AVX2_EPYC | {"avx512f", "avx512_vnni"}  # Cascade Lake


@pytest.mark.parametrize(
    "flags, name, tried",
    [
        (AMX_XEON, "amx", set(AUTO_PRECISIONS)),
        (ZEN4_EPYC, "avx512-bf16", set(AUTO_PRECISIONS)),
        (VNNI_ONLY, "vnni", {"fp32", "int8", "ov-int8"}),
        (AVX2_EPYC, "avx2", {"fp32", "int8"}),
        (set(), "baseline", {"fp32", "int8"}),
    ],
)
def test_each_kind_tries_what_its_arithmetic_makes_worth_it(flags, name, tried):
    kind = CpuKind(frozenset(flags))
    assert kind.name == name
    why = kind.auto_candidates(openvino=True)
    assert list(why) == list(AUTO_PRECISIONS)
    assert {p for p, w in why.items() if w is None} == tried
    for p, w in why.items():
        assert (w is None) == (p in tried), p
    if "ov-int8" not in tried:
        assert "avx512_vnni" in why["ov-int8"] and "slower" in why["ov-int8"]
    if "ov-bf16" not in tried:
        assert "bf16" in why["ov-bf16"]


def test_without_openvino_only_onnx_runtime_is_tried_and_the_extra_is_named():
    why = CpuKind(frozenset(AMX_XEON)).auto_candidates(openvino=False)
    assert {p for p, w in why.items() if w is None} == {"fp32", "int8"}
    assert all(
        "pip install 'prune-engine[openvino]'" in why[p] for p in ("ov-int8", "ov-bf16", "ov-int8-bf16")
    )


def test_this_machines_flags_are_read():
    kind = CpuKind.here()
    assert kind.name in ("amx", "avx512-bf16", "vnni", "avx2", "baseline")
    assert all(f.startswith(("avx", "amx")) for f in kind.shown_flags())


def test_a_cpu_whose_flags_cannot_be_read_is_unknown(monkeypatch):
    import engine.machine.cpu as cpu

    monkeypatch.setattr("builtins.open", lambda *a, **k: (_ for _ in ()).throw(OSError("no /proc")))
    assert cpu.cpu_flags() is None
    kind = cpu.CpuKind.here()
    assert kind.name == "unknown" and not kind.known
    # no false "this CPU does not compute bf16": every OpenVINO precision is tried (timing and the gate decide)
    assert kind.auto_candidates(openvino=True) == {p: None for p in cpu.AUTO_PRECISIONS}
    assert kind.auto_candidates(openvino=False)["ov-bf16"].startswith("OpenVINO is not installed")
    assert cpu.CpuKind(frozenset()).name == "baseline"  # read, and empty: a baseline CPU


def test_describe_says_whether_the_denormal_flush_is_in_force(monkeypatch):
    from engine.backends import onnxruntime as ort_backend

    assert ort_backend.denormal_state(False) == "IEEE denormals"
    monkeypatch.setattr(ort_backend, "_LIBM", object())
    assert ort_backend.denormal_state(True) == "denormals flushed"
    monkeypatch.setattr(ort_backend, "_LIBM", None)  # no glibc: macOS, Windows, ARM
    monkeypatch.setattr(ort_backend.platform, "machine", lambda: "arm64")
    assert ort_backend.denormal_state(True) == "denormal flush not in force (x86-64 only)"
    monkeypatch.setattr(ort_backend.platform, "machine", lambda: "AMD64")
    assert "ONNX Runtime's threads only" in ort_backend.denormal_state(True)
