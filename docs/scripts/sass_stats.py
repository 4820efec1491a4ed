"""Registers and inner-loop instruction mix of our CuTe DSL kernels, on a CPU (no GPU needed): compiles one variant
for sm_90a with the DSL keeping its cubin, reads the register count from the cubin's `.nv.info` (EIATTR_REGCOUNT),
and, when `nvdisasm` is found (NVDISASM or PATH; the `nvidia-cuda-nvdisasm` wheel has one), counts the
instructions of every loop (a backward branch) by opcode, with the number of MMAs, so the instructions per MMA
can be compared between versions of a kernel. SASS_OUT=path appends the whole listing to that file.

    python docs/scripts/sass_stats.py w4a16 nvfp4 8          # main W4A16 GEMM, M bucket 8, bf16 x, unsplit, wide CTA
    python docs/scripts/sass_stats.py w4a16 nvfp4 8 bulk     # the same with a load path (`w4a16_decode.parse_load`)
    python docs/scripts/sass_stats.py w4a16 nvfp4 8 registers --pack --f16 --narrow   # packed NVFP4, f16 x, 1x1x8
    python docs/scripts/sass_stats.py w4a16 nvfp4 8 registers --tiles    # packed NVFP4 in 16-row tiles
    python docs/scripts/sass_stats.py w4a16 nvfp4 16 registers --pack --cta 2x4x2   # a CTA shape RTxWNxWK
    python docs/scripts/sass_stats.py w4a16 nvfp4 16 xsmem:3 --pack --cta 2x4x1      # x from shared memory (its largest copy)
    python docs/scripts/sass_stats.py int8kv 64              # int8-KV decode attention, head dim 64, group 4, split
    python docs/scripts/sass_stats.py int8kv 64 --unsplit    # the same, one split (the output written directly)
    python docs/scripts/sass_stats.py int8kv 64 --fused      # split, the last CTA merging the splits (no combine kernel)
    python docs/scripts/sass_stats.py decode 128             # bf16 decode attention, head dim 128, group 4, split
    python docs/scripts/sass_stats.py combine 128            # their combine kernel
    python docs/scripts/sass_stats.py gemv nvfp4 1 2         # CUDA-core GEMV, M = 1, 2 K warps, bf16 x (--f16, --bias)
    python docs/scripts/sass_stats.py intgemv 4 1 256        # integer NVFP4 GEMV: 4 rows a warp, 1 K warp, 256 pieces
    python docs/scripts/sass_stats.py intgemv 2 1 256 --m 4  # the same for 4 rows of x
    python docs/scripts/sass_stats.py intgemv 4 1 256 --prefetch 4   # with the L2 prefetch window (FA4_INDUCTOR_INT_GEMV_PREFETCH)
    python docs/scripts/sass_stats.py intgemv 4 1 64 --weights 3      # the sibling GEMV over three weights (q / k / v)
    python docs/scripts/sass_stats.py intgemv 4 1 64 --splits 4       # K split among a cluster of 4 CTAs
    python docs/scripts/sass_stats.py intgemv 4 1 256 --warps 16      # CTAs of 16 warps (x quantized once for 64 rows)
    python docs/scripts/sass_stats.py intgemv 4 1 64 --gated [--gelu] # silu (gelu) (x @ gate^T) * (x @ up^T), one launch
    python docs/scripts/sass_stats.py int8gemv 4 1 512        # integer int8 GEMV: 4 rows a warp, 1 K warp, 512 pieces
    python docs/scripts/sass_stats.py int8gemv 4 1 512 --m 2 --warps 8   # 2 rows of x, CTAs of 8 warps (--bias, --f16)

Loops with no MMA (the GEMV's) report their fp32 FMAs instead: instructions per FFMA.
"""
import collections
import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

import torch

EIATTR_REGCOUNT = 0x2F


def options(argv, valued=(), parse=int):
    """(positional arguments, flags, {option: its value}) of a variant's argv; `valued` names the options that take
    a value (`--m 2`), read by `parse`."""
    values = {a: parse(argv[i + 1]) for i, a in enumerate(argv) if a in valued}
    positional = [a for i, a in enumerate(argv) if not a.startswith("--") and (i == 0 or argv[i - 1] not in valued)]
    return positional, {a for a in argv if a.startswith("--")}, values


def compile_variant(argv):
    if argv[0] == "w4a16":
        from fa4_inductor.kernels import switches, w4a16_decode as w4

        argv, flags, values = options(argv, ("--cta",), parse=switches.parse_cta_shape)
        m = int(argv[2])
        cta = (w4.CtaShape(*values["--cta"]) if "--cta" in values else
               w4.NARROW if "--narrow" in flags else
               w4.cta_shape(8192, m, 132, pack="tiles" if "--tiles" in flags else "--pack" in flags))
        load = w4.load_key(argv[3] if len(argv) > 3 else "registers", m, argv[1], cta)
        dtype = torch.float16 if "--f16" in flags else torch.bfloat16
        x_steps = w4.xsmem_buckets(load, m, argv[1], cta)[-1]
        w4.compiled(w4._Key("main", dtype, argv[1], m, "--split" in flags, False, "sm_90a", cta, False, load,
                            pack="--pack" in flags or "--tiles" in flags, tiled="--tiles" in flags, x_steps=x_steps))
    elif argv[0] == "gemv":
        from fa4_inductor.kernels import w4a16_decode as w4

        argv, flags, values = options(argv, ("--splits",))
        dtype = torch.float16 if "--f16" in flags else torch.bfloat16
        w4.compiled_gemv(w4.gemv_key(dtype, argv[1], int(argv[2]), "--bias" in flags, "sm_90a",
                                     int(argv[3]) if len(argv) > 3 else 1, splits=values.get("--splits", 1)))
    elif argv[0] == "intgemv":
        from fa4_inductor.kernels import nvfp4_int_gemv as g

        argv, flags, values = options(argv, ("--m", "--prefetch", "--weights", "--splits", "--warps"))
        dtype = torch.float16 if "--f16" in flags else torch.bfloat16
        gated = "gelu_tanh" if "--gelu" in flags else "silu" if "--gated" in flags else ""
        g.compiled(g.Key(dtype, values.get("--m", 1), "sm_90a", int(argv[1]), int(argv[2]), int(argv[3]),
                         prefetch=values.get("--prefetch", 0), weights=2 if gated else values.get("--weights", 1),
                         splits=values.get("--splits", 1), warps=values.get("--warps", 4), gated=gated))
    elif argv[0] == "int8gemv":
        from fa4_inductor.kernels import int8_int_gemv as g8

        argv, flags, values = options(argv, ("--m", "--warps"))
        dtype = torch.float16 if "--f16" in flags else torch.bfloat16
        g8.compiled(g8.Key(dtype, values.get("--m", 1), "--bias" in flags, torch.float32, "sm_90a", int(argv[1]),
                           int(argv[2]), int(argv[3]), warps=values.get("--warps", 4)))
    elif argv[0] == "int8kv":
        from fa4_inductor.kernels import decode_int8kv

        decode_int8kv.compiled(decode_int8kv._key(torch.bfloat16, int(argv[1]), 4, 1, False, False, False,
                                                  "--unsplit" not in argv, False, "sm_90a", "--fused" in argv))
    elif argv[0] == "decode":
        from fa4_inductor.kernels import decode

        decode.compiled(decode._Key("main", torch.bfloat16, int(argv[1]), 4, False, False, False, "--unsplit" not in argv,
                                    "sm_90a", stages=decode.stages_for(int(argv[1])), fused_combine="--fused" in argv))
    elif argv[0] == "combine":
        from fa4_inductor.kernels import decode

        decode.compiled(decode.combine_key(torch.bfloat16, int(argv[1]), 4, "sm_90a"))
    else:
        raise SystemExit(__doc__)


def sections(data: bytes):
    """(name, offset, size) of each section of an ELF64 file."""
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    entsize, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entsize) for i in range(count)]
    names = headers[names_index][4]
    for h in headers:
        yield data[names + h[0]:data.index(b"\0", names + h[0])].decode(), h[4], h[5]


def register_counts(data: bytes) -> list[int]:
    """EIATTR_REGCOUNT values of `.nv.info` (format 4 attributes: 2-byte size, then symbol index, value)."""
    counts = []
    for name, offset, size in sections(data):
        if name != ".nv.info":
            continue
        body, i = data[offset:offset + size], 0
        while i + 4 <= len(body):
            fmt, attr = body[i], body[i + 1]
            length = struct.unpack_from("<H", body, i + 2)[0] if fmt == 4 else 0
            if fmt == 4 and attr == EIATTR_REGCOUNT:
                counts.append(struct.unpack_from("<II", body, i + 4)[1])
            i += 4 + length if fmt == 4 else 4
    return counts


def loops(sass: str):
    """(instructions, opcode counter) of every loop body in nvdisasm's output."""
    labels, code = {}, []
    for line in sass.splitlines():
        label = re.match(r"^(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(code)
        ins = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if ins:
            code.append(ins.group(1))
    for i, text in enumerate(code):
        target = re.search(r"BRA\s+`\((\.L_x_\d+)\)", text)
        if target and labels.get(target.group(1), i) < i:  # not the trailing self-branch
            body = code[labels[target.group(1)]:i + 1]
            yield len(body), collections.Counter(re.match(r"(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", x).group(1) for x in body)


def main():
    dump = tempfile.mkdtemp()
    os.environ.update(CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=dump)
    compile_variant(sys.argv[1:])
    nvdisasm = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    for path in sorted(glob.glob(os.path.join(dump, "*.cubin"))):
        data = open(path, "rb").read()
        print(f"{os.path.basename(path)[:90]}: registers {register_counts(data)}")
        if nvdisasm:
            sass = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True).stdout
            if os.environ.get("SASS_OUT"):  # the whole listing, to read an order the counts do not show
                with open(os.environ["SASS_OUT"], "a") as f:
                    f.write(sass)
            for length, ops in loops(sass):
                mma = sum(n for op, n in ops.items() if op.endswith("MMA"))
                ffma = ops.get("FFMA", 0)
                per = f", {length / mma:.1f} a MMA" if mma else f", {length / ffma:.2f} a FFMA" if ffma else ""
                local = ops.get("LDL", 0) + ops.get("STL", 0)  # spills (or a local array) inside the loop
                print(f"  loop of {length} instructions, {mma or ffma} {'MMA' if mma or not ffma else 'FFMA'}{per}"
                      f"{f', {local} local loads / stores' if local else ''}: {ops.most_common(12)}")
            outside = sum(line.count("LDL") + line.count("STL") for line in sass.splitlines())
            print(f"  local loads / stores in the whole kernel: {outside}")
    shutil.rmtree(dump)


if __name__ == "__main__":
    main()
