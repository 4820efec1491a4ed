"""GPU tier on two GPUs (NCCL): tensor-parallel prefill and decode and FSDP2 training steps of a small Llama
(4 layers, hidden 512, 8 query / 2 KV heads) with our backend against default torch.compile, through
`fa4_inductor/bench/distributed.py --small --check` under torchrun. The script fails (exit status 1) when a
rank's fa4 attention count is not one per layer (none where FSDP2's per-layer units hide the mask, see
tests/test_distributed.py), when logits or gradients differ from default compile's beyond bf16 rounding, or
when a measurement fails. Skipped without two CUDA devices."""

import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]


def torchrun(*args: str, timeout: int = 900) -> str:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "fa4_inductor.bench.distributed", "--small", "--check", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    return done.stdout


@pytest.mark.parametrize("suite, attention, dtensor", [
    pytest.param("tp-prefill", "sdpa,eager", False, id="tp-prefill"),
    pytest.param("tp-prefill", "eager", True, id="tp-prefill-dtensor"),  # kernels/sharding.py's heads rule
    pytest.param("tp-decode", "sdpa", False, id="tp-decode"),
    pytest.param("fsdp", "sdpa", False, id="fsdp"),  # at the root, and per layer with the layers compiled
])
def test_two_gpus(suite, attention, dtensor):
    out = torchrun("--suite", suite, "--attention", attention, *(["--dtensor"] if dtensor else []))
    for code in attention.split(","):
        assert f"| {code} |" in out, out
