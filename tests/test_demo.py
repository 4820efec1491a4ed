"""The README's demo command works and checks itself."""

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_command_passes():
    result = subprocess.run([sys.executable, "-m", "fa4_inductor", "demo", "--seq-len", "32"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("2 rewritten, 0 kept as written") == 2
    assert result.stdout.count("(ok, tolerance") == 2


@pytest.mark.slow
def test_demo_detects_a_mismatch(monkeypatch):
    """The demo must fail when the compiled output is wrong: break the op's CPU kernel and run it in-process."""
    import torch

    from fa4_inductor import demo
    from fa4_inductor.kernels import reference

    real = reference.forward

    def wrong(*args, **kwargs):
        out, lse = real(*args, **kwargs)
        return out * 1.5, lse

    monkeypatch.setattr(reference, "forward", wrong)
    torch._dynamo.reset()
    assert demo.run(seq_len=16) == 1
