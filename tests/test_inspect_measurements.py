"""`atom-run ART inspect --measurements`: the build's kernel timings, one line per timed shape with its
fastest candidates first, whatever the op's table looks like; a CPU artifact says nothing was timed."""
import pytest

from atom_aot.runtime import cli
from atom_aot.runtime.inspect import measurement_lines

MEASURED = {
    "context_tokens": 2048,
    "decode": {"1": {"16,64,4,2,256,16": 0.031, "16,128,4,2,512,16": 0.029}},
    "moe": {"256": {"16,64,128,1,4,4": 0.51, "16,64,256,1,4,2": None, "32,64,128,1,4,4": 0.49}},
    "fp8_linear": {"decode": {"chosen": "aten", "qkv_proj 1x6144x4096": {"aten": 0.045, "triton,16,64,128,4,4": 0.031,
                                                                          "triton,32,128,128,4,3": 0.05,
                                                                          "triton,64,128,128,4,3": 0.06,
                                                                          "triton,128,128,128,8,3": 0.09}}},
}


def test_each_timed_shape_lists_its_fastest_first_and_a_candidate_that_did_not_launch_last():
    lines = measurement_lines(MEASURED)

    def line_of(path: str) -> str:
        (line,) = [line for line in lines if line.strip().startswith(path + " ")]
        return line
    assert line_of("decode / 1").endswith("16,128,4,2,512,16: 0.0290, 16,64,4,2,256,16: 0.0310")
    assert line_of("moe / 256").endswith("32,64,128,1,4,4: 0.4900, 16,64,128,1,4,4: 0.5100, 16,64,256,1,4,2: -")
    assert line_of("fp8_linear / decode / qkv_proj 1x6144x4096").endswith(
        "triton,16,64,128,4,4: 0.0310, aten: 0.0450, triton,32,128,128,4,3: 0.0500, "
        "triton,64,128,128,4,3: 0.0600 (+1 more)")
    assert line_of("fp8_linear / decode / chosen").endswith(" aten")
    assert line_of("context_tokens").endswith(" 2048")


def test_a_cpu_artifact_has_nothing_timed(tiny_llama_eager_artifact, capsys):
    assert cli.main([str(tiny_llama_eager_artifact), "inspect", "--measurements"]) == 0
    out = capsys.readouterr().out
    assert "measurements (ms, fastest first)" in out and "nothing was timed" in out
    with pytest.raises(SystemExit) as refused:                                      # no option ignored
        cli.main([str(tiny_llama_eager_artifact), "inspect", "--bogus"])
    assert refused.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
