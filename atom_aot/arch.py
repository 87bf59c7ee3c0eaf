"""Which target this machine is, and the toolchain versions an artifact is tied to.

An arch is a name (`cpu`, `sm90`, `gfx942`, ...); everything that differs between arches is data
keyed by that name (kernel choices in tuning.json), not branches in the engine.
"""
from __future__ import annotations

import torch

ARCHES = ("cpu", "sm80", "sm90", "sm100", "gfx942", "gfx950")
DEFAULT_CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
# Arches whose FP8 is not the OCP e4m3fn that atom-aot quantizes, loads and computes in: what they lack.
FP8_UNSUPPORTED = {
    "sm80": "no FP8 in its tensor cores or its conversions (FP8 needs sm89+)",
    "gfx942": "its FP8 is e4m3fnuz (exponent bias 8, largest value 240, no negative zero), which atom-aot does "
              "not convert to yet (gfx950 takes e4m3fn)",
}


def detect_arch() -> str:
    """The arch of the first accelerator here, or `cpu`."""
    if not torch.cuda.is_available():
        return "cpu"
    props = torch.cuda.get_device_properties(0)
    if torch.version.hip:
        return props.gcnArchName.split(":")[0]
    return f"sm{props.major}{props.minor}"


def device_for_arch(arch: str) -> torch.device:
    return torch.device("cpu" if arch == "cpu" else "cuda")


def cpu_isa() -> str:
    """The CPU vector ISA PyTorch dispatches to here; compiled CPU code needs the same or better."""
    return torch.backends.cpu.get_cpu_capability()


def toolchain() -> dict:
    """Versions an artifact's compiled code depends on: all must match at load time."""
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip,
            "triton": None, "cpu_isa": cpu_isa()}
    if torch.cuda.is_available():   # read from the package metadata: importing triton costs seconds
        from importlib.metadata import PackageNotFoundError, version
        try:
            info["triton"] = version("triton")
        except PackageNotFoundError:
            info["triton"] = None
    return info
