"""What this CPU computes fast, from its flags (/proc/cpuinfo), and so which precisions
`prune export --precision auto` (and the default model's first use) tries on it.

The kinds, from the flags (the fastest arithmetic each adds):
- "amx": AMX tiles for int8 and bf16 (amx_int8, amx_bf16; Intel Xeon since Sapphire Rapids);
- "avx512-bf16": AVX-512 with VNNI and BF16 (AMD EPYC Zen 4 and later, Intel Cooper Lake);
- "vnni": int8 dot products without bf16 (avx512_vnni or avx_vnni);
- "avx2": 8-bit multiplies through 16-bit sums (ONNX Runtime's U8S8 kernels), no bf16;
- "baseline": none of these.

The candidates per kind follow what `prune bench` and `prune export --precision auto`
measured on each (docs/performance.md, docs/precisions.md): OpenVINO's static INT8 runs
slower than ONNX Runtime's fp32 on an AVX2 CPU without VNNI (0.79x, AMD EPYC, this
project's auto table), so it is tried only where the CPU has int8 dot products; OpenVINO's
bf16 paths only where the CPU computes bf16. Every candidate still passes the fidelity
gate and is timed before it is picked: the kinds only decide what is worth exporting.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the flags that give bf16 arithmetic
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: the flags that give int8 dot products (VNNI, or AMX's int8 tiles)
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
AMX_FLAGS = ("amx_int8", "amx_bf16")
#: why a bf16 path is not run on this CPU
BF16_MISSING = f"this CPU does not compute bf16 ({' or '.join(BF16_FLAGS)})"

#: every precision `--precision auto` knows, in the order it tries them
AUTO_PRECISIONS = ("fp32", "int8", "ov-int8", "ov-bf16", "ov-int8-bf16")


#: why auto tries every precision where the flags cannot be read
FLAGS_UNKNOWN = (
    "this CPU's flags cannot be read here (they are read from Linux's /proc/cpuinfo on x86): "
    "every precision is tried, and the timing decides"
)


def cpu_flags() -> set[str] | None:
    """This CPU's flags (Linux's /proc/cpuinfo), or None where they cannot be read (macOS,
    Windows, and ARM, whose cpuinfo has "Features", not these flags)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


@dataclass(frozen=True)
class CpuKind:
    """What a CPU computes fast, from its flags (`known` False: they could not be read)."""

    flags: frozenset[str]
    known: bool = True

    @classmethod
    def here(cls) -> "CpuKind":
        """This machine's."""
        flags = cpu_flags()
        return cls(frozenset(flags or ()), flags is not None)

    @property
    def bf16(self) -> bool:
        """Whether it computes bf16 natively."""
        return any(f in self.flags for f in BF16_FLAGS)

    @property
    def int8_dot(self) -> bool:
        """Whether it has int8 dot-product instructions (VNNI or AMX)."""
        return any(f in self.flags for f in INT8_DOT_FLAGS)

    @property
    def name(self) -> str:
        """amx, avx512-bf16, vnni, avx2, baseline, or unknown (flags not readable)."""
        if not self.known:
            return "unknown"
        if all(f in self.flags for f in AMX_FLAGS):
            return "amx"
        if self.bf16 and self.int8_dot:
            return "avx512-bf16"
        if self.int8_dot:
            return "vnni"
        return "avx2" if "avx2" in self.flags else "baseline"

    def shown_flags(self) -> list[str]:
        """The flags that decide (AVX and AMX ones), sorted."""
        return sorted(f for f in self.flags if f.startswith(("avx", "amx")))

    def auto_candidates(self, openvino: bool) -> dict[str, str | None]:
        """Each precision of AUTO_PRECISIONS -> None where `--precision auto` tries it on
        this CPU (`openvino`: whether OpenVINO is installed), else why not."""
        why: dict[str, str | None] = {"fp32": None, "int8": None}
        no_ov = None if openvino else "OpenVINO is not installed: pip install 'prune-engine[openvino]'"
        if not self.known:  # no false reason: OpenVINO's plugin and the timing decide
            return {**why, **{name: no_ov for name in AUTO_PRECISIONS if name not in why}}
        why["ov-int8"] = no_ov or (
            None
            if self.int8_dot
            else f"no int8 dot products on this CPU ({' or '.join(INT8_DOT_FLAGS)}): "
            "OpenVINO's static INT8 ran slower than ONNX Runtime fp32 on such a CPU"
        )
        for name in ("ov-bf16", "ov-int8-bf16"):
            why[name] = no_ov or (None if self.bf16 else BF16_MISSING)
        return why
