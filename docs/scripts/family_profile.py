"""Where a families-suite prefill row's time goes, under default torch.compile and ours (session 57: Gemma 2's
left-padded prefill ran 0.83x default compile on the H100). For each backend: the wall median, the op's route per
call signature (the "fa4_inductor.kernels" debug log), and the CUDA kernels by total time over 3 calls.

    python3 docs/scripts/family_profile.py gemma2 padded [seq]

The CPU runs it at a tiny scale as a smoke test.
"""

import logging
import sys

import torch

from fa4_inductor.bench import families, models, timing

name, case = sys.argv[1], sys.argv[2]
seq = int(sys.argv[3]) if len(sys.argv) > 3 else families.FAMILIES[name].seq
cuda = torch.cuda.is_available()
device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
scale = None if cuda else dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=64)
if not cuda:
    seq = 128
model = families.FAMILIES[name].build(device, dtype, scale)
vocab = model.config.vocab_size
if case == "padded":
    tokens, mask = models.padded_batch(vocab, 4, seq // 2, families._pads(seq // 2), device, "left")
else:
    tokens, mask = models.padded_batch(vocab, 1, seq, [0], device)[0], None


class Routes(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.seen = []

    def emit(self, record):
        text = record.getMessage()
        if text not in self.seen:
            self.seen.append(text)


routes = Routes()
log = logging.getLogger("fa4_inductor.kernels")
log.setLevel(logging.DEBUG)
log.addHandler(routes)
for label, backend in models.BACKENDS.items():
    torch._dynamo.reset()
    compiled = models.compile_model(model, backend)
    routes.seen.clear()

    def call():
        return compiled(tokens, attention_mask=mask, logits_to_keep=1).logits

    with torch.no_grad():
        call()
        ms = timing.median_wall_ms(call, repeats=7) if cuda else float("nan")
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(3):
                call()
            if cuda:
                torch.cuda.synchronize()
    print(f"===== {name} {case} seq {seq}, {label}: {ms:.3f} ms (wall median of 7) =====")
    for line in routes.seen:
        print("  route:", line[:300])
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=22, max_name_column_width=90))
