# Unrun GPU work. Session 57 got one H100 call (docs/benchmarks.md "Session 57"); next: `d57`, then `fam56c`, the
# rest of `fam56b` (pythia, olmo2). Session 56 (an H100 after eight refused starts) ran `fam56a` (the sliding-window decode test: 4
# passed; the families suite's first rows, docs/benchmarks.md "Session 56") and a GPT-2 prefill check. Next: `fam56b`
# (Gemma 2's padded and training rows, Phi-3, Pythia, Qwen3, OLMo 2), `fam56c` (the sliding-window decode rows, now
# without CUDA graphs), then session 55's queue: `ns56` (what the host waits on in NVFP4's recomputed backward: ~28 ms
# of wall beyond its kernels), `h49` (session 49's CTA rules on an H200; two calls' worth), `a50`'s f16 and 2..4-row
# lines, `p47` (low priority), `m47`, `w43`, `p43`, `n36`; the fp8 plain-buffer prefill against default compile
# (`g51`'s last line, ~400 s: a call of its own).
# Parts of earlier sessions below keep their notes.
# Output goes to $OUT/log.txt. Have the next call ready: the machine goes back 30 s after a call, and a fresh one needs
# .gpu/a and .gpu/b again. Run one part a call:  bash scratch/next_gpu.sh x48
# Never `pkill -f pytest` here: it matches this script's own command line. A pytest cut by `timeout` can leave xdist
# workers on the GPU: kill the PIDs `nvidia-smi --query-compute-apps=pid --format=csv,noheader` lists.
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; local t=$SECONDS; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$? $((SECONDS - t))s" >>$L; }
case "$1" in
d57) # session 57: the decode kernel at head dim 96 (Phi-3; 8 x 32 swizzle atoms, CPU-compiled only), its GPU tests
    # (they add 96 to `decode.HEAD_DIMS`; once they pass, add it for good and time the phi3 decode row: 0.87x default
    # compile on FA4 before), then where Gemma 2's left-padded prefill (0.83x) goes
    nvidia-smi -L >>$L
    run timeout 100 $P -n 8 tests/test_gpu_decode.py -k "96"
    run timeout 120 python3 -m fa4_inductor bench --suite families --families phi3:decode   # FA4 until 96 is routed
    run timeout 90 python3 docs/scripts/padded_attention.py     # one Gemma 2 attention: padded on the op vs as written
    run timeout 150 python3 docs/scripts/family_profile.py gemma2 padded ;;
fam56a) # session 56: a decode step over a sliding-window cache (window_left = slots - 1) now runs the decode kernel
    # (`attention.device_flags`); then HF decoder families other than Llama at their released shapes (4 layers), ours
    # against default compile (`bench --suite families`): the sliding-window and small ones first
    nvidia-smi -L >>$L
    run timeout 100 $P -n 4 tests/test_gpu_decode.py -k "sliding_window_cache"
    run timeout 380 python3 -m fa4_inductor bench --suite families \
      --families gemma3:prefill+decode,mistral:prefill+padded+decode,gpt2:prefill+padded+decode,gemma2:prefill+decode ;;
fam56c) # the sliding-window families' decode rows again, now without CUDA graphs (fam56a's recorded a graph a step
    # under both backends: transformers' sliding cache counts tokens in a Python int)
    nvidia-smi -L >>$L
    run timeout 400 python3 -m fa4_inductor bench --suite families --families gemma3:decode,mistral:decode,gemma2:decode ;;
fam56b) # fam56a's second half
    nvidia-smi -L >>$L
    run timeout 560 python3 -m fa4_inductor bench --suite families \
      --families gemma2:padded+train,phi3:prefill+decode,pythia:prefill+train,qwen3:prefill+train,olmo2:prefill ;;
t44) # session 44: -inf in an additive mask hides its key on every CUDA path (decode kernel: no longer floored; SDPA
    # fallback and the hand-written rewrite's SDPA: `floor_additive`), and a hand-written softmax's mask input that
    # hides every key of a row compiles to eager's NaN. The decode kernel changed only where it reads an additive
    # mask (a compile-time variant): the decode tier's additive-mask tests, then FA4's
    nvidia-smi -L >>$L
    run timeout 200 $P -n 8 tests/test_gpu_decode.py -k "additive or minus_inf or float_mask"
    run timeout 150 $P -n 4 tests/test_gpu_fa4.py -k "additive or rows_that_see_no_key or per_query" ;;
f45) # session 45: fp8 (e4m3) weights on the decode GEMM (`w4a16_decode.fp8_matmul`, new; CPU-compiled only): its
    # numerics against float64 and against `torch._scaled_mm`, then timed against `_scaled_mm` and bf16 cuBLAS
    nvidia-smi -L >>$L
    run timeout 200 $P -n 8 tests/test_gpu_w4a16.py -k fp8
    run timeout 120 $P -n 4 tests/test_gpu_fp8.py
    run timeout 150 python3 tests/bench_fp8.py ;;
e46) # session 45's fp8.from_torchao (plain buffers): the fp8 decode step end to end without torchao's subclasses; the
    # step's GPU time was 1.43 ms under ours against 2.32 under default compile, host-bound at ~4 ms with the subclasses
    nvidia-smi -L >>$L
    run timeout 150 $P -n 4 tests/test_gpu_fp8.py      # the rule now sends narrow weights (N <= 2048) to ours too
    run timeout 100 python3 tests/bench_fp8.py --m 1,16 --shapes 2048x2048,512x2048
    run timeout 400 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-prefill \
      --quant-e2e-runs bf16:default,bf16:ours,fp8:default,fp8:ours,fp8:plain --quant-prompt 4096 ;;
h46) # session 46's xsmem default on the H200 (H100: 1.22-1.32x the former path at 16 rows, plain layout): the tests, the
    # new rule against the former, issue 15's one-row / 16-row ratio there (H100: 1.44x on 8192 x 8192)
    nvidia-smi -L >>$L
    run timeout 150 $P -n 8 tests/test_gpu_w4a16.py -k "x_from_shared_memory or auto_takes"
    run timeout 150 python3 tests/bench_w4a16.py --m 16,9 --shapes 8192x8192,14336x4096,4096x14336,2048x8192,8192x2048 \
      --load auto,rolling --pack off,on
    run timeout 60 python3 tests/bench_w4a16.py --m 1,16 --shapes 8192x8192,14336x4096 ;;
n47) # where the xsmem kernel's warps wait now (16 rows, 8192 x 8192, plain and packed, with and without L2 bursts):
    # session 46's ncu had long scoreboard at 1.49 of 4.67 cycles an issued instruction, the rest not broken down; the
    # packed layout issues fewer instructions yet runs slower (H200 24.0 against 22.5 us), so the issue rate is not it
    nvidia-smi -L >>$L
    S="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
    run timeout 120 ncu --clock-control none --profile-from-start off --metrics "$S" --section SpeedOfLight \
      --section MemoryWorkloadAnalysis python3 docs/scripts/ncu_w4a16.py 8192 8192 --m 16 \
      --mma xsmem@2x8x1,xsmem+prefetch@2x8x1
    run timeout 150 ncu --clock-control none --profile-from-start off --set full -o $OUT/x16 \
      python3 docs/scripts/ncu_w4a16.py 8192 8192 --m 16 --mma xsmem@2x8x1
    ncu --import $OUT/x16.ncu-rep --page source --print-source sass --csv > $OUT/x16_sass.csv 2>>$L
    run python3 docs/scripts/sass_hotspots.py $OUT/x16_sass.csv 30
    rm -f $OUT/x16_sass.csv ;;
x48) # session 48: x's shared copy in parts ("xsmem+parts<n>", each part on its own mbarrier; CPU-compiled only): n47's
    # ncu had ~18% of the 16-row xsmem kernel's stall samples at the wait for the whole copy before the first MMA.
    # Its GPU tests, then parts 1 / 2 / 4 / 8 on the default CTAs; then wide N at 5 / 8 rows on 2 x 8 x 1 (v47: the
    # 128256 x 4096 lm_head 123 against 157-178 us on the H100)
    nvidia-smi -L >>$L
    run timeout 150 $P -n 8 tests/test_gpu_w4a16.py -k "x_from_shared_memory and parts or k_ranges or auto_takes"
    XP="xsmem,xsmem+parts2,xsmem+parts4,xsmem+parts8"
    run timeout 90 python3 tests/bench_w4a16.py --m 16,9 --shapes 8192x8192,14336x4096 --cta 2x8x1 --load $XP
    run timeout 50 python3 tests/bench_w4a16.py --m 16 --shapes 4096x14336 --cta 2x4x1 --load $XP
    run timeout 60 python3 tests/bench_w4a16.py --m 16,9 --shapes 2048x8192,2048x2048 --cta 1x8x1 --load $XP
    # 16 warps a SM (1 x 16 x 1: one row tile a warp, 109 registers, the same 256 rows a CTA) against 8 (2 x 8 x 1)
    run timeout 90 python3 tests/bench_w4a16.py --m 16,9,4 --shapes 8192x8192,14336x4096,4096x14336 --cta 1x16x1,2x8x1 \
      --load xsmem,xsmem+parts4 ;;
x48b) # x48's second half (one call holds the first): wide N at 5 / 8 rows, the narrow rule below K = 8192
    nvidia-smi -L >>$L
    run timeout 100 python3 tests/bench_w4a16.py --m 5,8 --shapes 128256x2048,128256x4096,4096x14336 --cta auto,2x8x1 \
      --load auto,xsmem+parts4
    # the narrow rule below K = 8192 (v47: 2048 x 2048 at 16 rows 7.4 us on the rule, 0.89x bf16; 5.4 on 1 x 8 x 1)
    run timeout 80 python3 tests/bench_w4a16.py --m 16,9 --shapes 1024x4096,2048x4096,2048x2048,512x2048 \
      --cta auto,1x8x1 --load auto,xsmem+parts4
    run timeout 60 python3 tests/bench_w4a16.py --m 1,16 --shapes 8192x8192,14336x4096 ;;
qt53) # session 53's joint stage: a training step over frozen torchao int8 / NVFP4 weights (QLoRA-style: norms,
    # embedding, lm_head trained), Llama-1B shape, 2048 tokens: ms and peak GiB, eager / default compile / ours with the
    # stage off / on (CPU: the forward saves codes and scales instead of a float copy of each weight, ~2.4 GB here)
    nvidia-smi -L >>$L
    run timeout 220 python3 docs/scripts/quant_train.py int8 2048
    run timeout 220 python3 docs/scripts/quant_train.py nvfp4 2048 ;;
ns56) # session 55's open question: NVFP4's step with its weights recomputed (`all`) spends ~28 ms of wall beyond its
    # kernels (48-61 ms against 28 ms of kernels); the host's costliest calls (CUDA API: syncs, copies, launches)
    # against the saved step's (`on`, the default now). Fresh caches: ~200 s a backend to compile
    nvidia-smi -L >>$L
    QUANT_TRAIN_PROFILE=2 run timeout 500 python3 docs/scripts/quant_train.py nvfp4 2048 cuda on,all ;;
qt55) # qt53 as it has to run, first: NVFP4, int8 and fp8 under default / off / on compiled side by side
    # (QUANT_TRAIN_WARM: Inductor's caches filled, nothing timed; ~250 s), for `qt55b` and `qt55c` on the same machine,
    # each format timed in one process (~270 s with the caches). Session 54 timed int8 this way; its NVFP4 rows came
    # from processes timed side by side, which another's steps disturb: not established
    nvidia-smi -L >>$L
    for f in nvfp4 int8 fp8; do for w in default off on; do
      QUANT_TRAIN_WARM=1 timeout 330 python3 docs/scripts/quant_train.py $f 2048 cuda $w > /tmp/qt_${f}_${w}.txt 2>&1 &
    done; done; wait
    for f in nvfp4 int8 fp8; do for w in default off on; do tail -1 /tmp/qt_${f}_${w}.txt >>$L; done; done ;;
qt55b) # (after qt55, same machine)
    nvidia-smi -L >>$L
    run timeout 330 python3 docs/scripts/quant_train.py nvfp4 2048 cuda default,off,on ;;
qt55c) # (after qt55, same machine)
    nvidia-smi -L >>$L
    run timeout 330 python3 docs/scripts/quant_train.py fp8 2048 cuda default,off,on ;;
v53) # session 53, first call: the whole model tier (not run in full since session 39; the subclass-weights rewrite,
    # the crossover fix and the fp8 routes changed since), then ab52's fp8 rows (rewrite off / on)
    nvidia-smi -L >>$L
    run timeout 220 $P -n 8 tests/test_gpu_models.py
    run timeout 110 python3 docs/scripts/decode_profile.py fp8 ours subclass_weights=0
    run timeout 110 python3 docs/scripts/decode_profile.py fp8 ours ;;
v53b) # the rest of ab52: torchao NVFP4 weights under ours, the rewrite off / on, and under default compile (not timed
    # before: the "never slower than default compile" row); default compile's fp8 step
    nvidia-smi -L >>$L
    run timeout 110 python3 docs/scripts/decode_profile.py quant nvfp4 ours subclass_weights=0
    run timeout 150 python3 docs/scripts/decode_profile.py quant nvfp4 ours,default
    run timeout 110 python3 docs/scripts/decode_profile.py fp8 default ;;
v53c) # the quant GPU tiers (not run since the subclass-weights rewrite)
    nvidia-smi -L >>$L
    run timeout 200 $P -n 8 tests/test_gpu_fp8.py tests/test_gpu_nvfp4.py tests/test_gpu_int8kv.py tests/test_gpu_quant.py ;;
ab52) # session 52's subclass-weights rewrite, A/B on one machine (s52's rows came from other runs): each subclass step
    # under ours with the rewrite off / on, then default compile (wall against kernels: the host's share); then the
    # subclass GPU model tests (~35 s each; s52 cut the fp8 one at 130 s)
    nvidia-smi -L >>$L
    for k in "fp8 ours" "nvfp4 torchao"; do
      run timeout 150 python3 docs/scripts/decode_profile.py $k subclass_weights=0
      run timeout 150 python3 docs/scripts/decode_profile.py $k
    done
    run timeout 150 python3 docs/scripts/decode_profile.py fp8 default
    run timeout 200 $P tests/test_gpu_models.py -k "quantized_weights_generate and False" ;;
s52) # session 52: torchao subclass weights reach Inductor as their inner tensors (lowering/subclass_weights.py), so
    # AOTAutograd's per-call unwrap (torch 2.11: ~3 us a weight, h51) is gone: the subclass decode step against plain
    # buffers (fp8 subclass under ours, h51: 1.93 ms a step on 1.34 of kernels; plain 1.66 ms/token in g51)
    nvidia-smi -L >>$L
    run timeout 130 $P tests/test_gpu_models.py -k "quantized_weights_generate and False and not nvfp4"
    run timeout 150 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-prefill \
      --quant-e2e-runs fp8:ours,fp8:plain --quant-prompt 4096
    run timeout 150 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-prefill \
      --quant-e2e-runs nvfp4:ours,nvfp4:plain --quant-prompt 4096 ;;
g51) # f51's finding: the fp8 plain-buffer decode step stayed on cuDNN SDPA (0.53 ms a step), as `small_decode` counted no
    # `_scaled_mm` weight bytes; now it counts them: the step end to end against bf16 under ours
    nvidia-smi -L >>$L
    run timeout 120 $P tests/test_gpu_models.py -k "quantized_weights_generate and fp8"   # ("fp8", True) is new
    run timeout 200 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-prefill \
      --quant-e2e-runs fp8:plain,bf16:ours,fp8:default --quant-prompt 4096
    run timeout 120 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-e2e \
      --quant-prefill-runs fp8:plain,fp8:default ;;
h51) # the fp8 subclass step under ours is host-bound at 2.70 ms on 1.31 ms of kernels, default compile's 2.35 on 2.19
    # (f51): whose host time is larger, and where (cProfile of the timed steps)
    nvidia-smi -L >>$L
    run timeout 300 python3 docs/scripts/decode_profile.py fp8 ours,default host=1 ;;
f51) # session 51's e2e (H100): fp8 weights under ours 2.0-2.2 ms/token as plain buffers (bf16 under ours 1.66), 4.13 as
    # torchao's subclasses against default compile's 2.52: where each step's time goes (wall against kernels, skips)
    nvidia-smi -L >>$L
    run timeout 330 python3 docs/scripts/decode_profile.py fp8 plain,ours,default
    run timeout 120 python3 docs/scripts/decode_profile.py nvfp4 bf16 ;;
a50) # session 50's defaults: plain NVFP4 on 1 x 16 x 1 takes "xsmem+xperm+rot", on 1 x 8 x 1 "xsmem+rot" (xp49, H100:
    # 1-6% faster), and 2..4 rows over wide weights (not 8192-row ones) take 1 x 16 x 1 (H100: 128256 x 2048 63 against
    # 80-89 us). Their GPU tests, f16 x (the +xperm variant spills one word there), 4096 x 4096 at 2..4 rows, the table
    nvidia-smi -L >>$L
    run timeout 200 $P -n 8 tests/test_gpu_w4a16.py -k "auto_takes or auto_load_in_a_cuda_graph or rotated_decode \
      or x_from_shared_memory_in_a_cuda_graph"
    run timeout 80 python3 tests/bench_w4a16.py --dtype float16 --m 16,8 --shapes 8192x8192,4096x14336,128256x2048 \
      --cta 1x16x1 --load xsmem,xsmem+rot,xsmem+xperm+rot
    run timeout 60 python3 tests/bench_w4a16.py --dtype float16 --m 16,9 --shapes 2048x8192,1024x4096 --cta 1x8x1 \
      --load xsmem,xsmem+rot
    run timeout 60 python3 tests/bench_w4a16.py --m 2,3,4 --shapes 4096x4096,14336x2048,6144x4096 --cta 2x2x4,1x16x1 \
      --load auto
    run timeout 120 python3 tests/bench_w4a16.py --m 1,2,4,8,16 --shapes 8192x8192,14336x4096,4096x14336,2048x8192,\
8192x2048,128256x4096 ;;
xp49) # session 49's "xsmem+xperm" and "+rot" (CPU-compiled only): x's shared copy rewritten once into the plain NVFP4
    # MMA's operand pairs, so the K loop has no prmt for x; the pairs' signs from one rotation of each word (two
    # instructions a word fewer; the decode's bits checked by the CPU emulation). sm_90a, 1 x 16 x 1 at 16 rows: loop
    # instructions 964 / 846 (+xperm) / 902 (+rot) / 774 (both), registers 109 / 128 / 110 / 128; 8 rows 852 / 790 / - /
    # 726. Their GPU tests (the same outputs), then against none on the rule's CTAs; if they win, make them the default
    # ("auto" and plain "xsmem"; "+rot" also fits the register and rolling paths)
    nvidia-smi -L >>$L
    run timeout 200 $P -n 8 tests/test_gpu_w4a16.py -k "x_from_shared_memory and (xperm or rot or k_ranges) or rotated_decode"
    X4="xsmem,xsmem+xperm,xsmem+rot,xsmem+xperm+rot"
    run timeout 150 python3 tests/bench_w4a16.py --m 16,9,8,5 --shapes 8192x8192,14336x4096,4096x14336,128256x2048 \
      --cta 1x16x1 --load $X4
    run timeout 80 python3 tests/bench_w4a16.py --m 16,9 --shapes 2048x8192,1024x4096,2048x2048 --cta 1x8x1 --load $X4
    # the rolling path's "+rot" where 5..8 rows keep it (8192-row weights; sm_90a 734 loop instructions against 799)
    run timeout 60 python3 tests/bench_w4a16.py --m 8,5 --shapes 8192x8192,8192x2048 --cta 2x2x4 --load rolling,rolling+rot ;;
k49) # issue 16's b8 x 32k (1.81x our bf16 kernel on the H200, target 1.85x: <= 132.2 us): session 43's s43 sweep had
    # its two-CTAs-a-SM split (4, the rule since session 47) at 132.7 us with a 72 KB ring budget against 135.0 at the
    # default 100 KB (b64 x 32k 994.5 against 1015.8; b1 x 32k, one CTA a SM, 24.3 against 23.5). Alternating rounds,
    # to tell a 2% step from noise; if 72 KB wins at two CTAs a SM, make `stages_for` take the split regime
    nvidia-smi -L >>$L
    for r in 1 2 3; do for kb in 100 72; do
      run env FA4_INDUCTOR_DECODE_SMEM_KB=$kb timeout 60 python3 tests/bench_decode_int8kv.py --b 8 --sk 32768 --d 128
    done; done
    for kb in 100 72; do
      run env FA4_INDUCTOR_DECODE_SMEM_KB=$kb timeout 60 python3 tests/bench_decode_int8kv.py --b 64 --sk 32768 --d 128
      run env FA4_INDUCTOR_DECODE_SMEM_KB=$kb timeout 60 python3 tests/bench_decode_int8kv.py --b 1 --sk 131072 --d 128
    done ;;
h49) # session 49's CTA rules on the H200 (measured on H100s only): "auto" (1 x 16 x 1 wide, 1 x 8 x 1 narrow from K = 4096,
    # 5..8 rows on 1 x 16 x 1 but for 8192-row weights) against the CTAs it replaced; issue 15's ratio; narrow weights at
    # 5..8 rows on xsmem (H100: 2048 x 8192 at 8 rows 8.6 us on 1 x 16 x 1 against 9.9 on the rule's 1 x 1 x 8)
    nvidia-smi -L >>$L
    run timeout 150 $P -n 8 tests/test_gpu_w4a16.py -k "auto_takes or x_from_shared_memory_in_a_cuda_graph"
    run timeout 120 python3 tests/bench_w4a16.py --m 16,8,5 --shapes 8192x8192,4096x14336,14336x4096,4096x4096,128256x2048 \
      --cta auto,2x8x1,2x4x1,2x2x4 --load auto
    run timeout 80 python3 tests/bench_w4a16.py --m 16,9 --shapes 1024x4096,512x4096,2048x4096 --cta auto,1x1x8 --load auto
    run timeout 80 python3 tests/bench_w4a16.py --m 8,5 --shapes 2048x8192,2048x2048,1024x4096 --cta auto,1x8x1,1x16x1 --load auto
    run timeout 60 python3 tests/bench_w4a16.py --m 1,16 --shapes 8192x8192,14336x4096,4096x14336
    # 2..4 rows: the GEMVs (the rule) against the tensor-core kernel on 1 x 16 x 1 xsmem (H100 run 1: 8192 x 8192 at 4
    # rows 21.3 us there)
    run timeout 80 python3 tests/bench_w4a16.py --m 4,2 --shapes 8192x8192,4096x14336,128256x2048 --cta auto,1x16x1 \
      --gemv on,off
    # 12 warps a SM two steps ahead (1 x 12 x 1, "xsmem:3": 155 registers, no spills; 1 x 16 x 1 at three sets spills)
    # against 16 warps one step ahead
    run timeout 80 python3 tests/bench_w4a16.py --m 16,9 --shapes 8192x8192,14336x4096,4096x14336 --cta 1x16x1,1x12x1 \
      --load xsmem,xsmem:3
    # 8192-row weights at 5..8 rows (the one-wave exception: 2 x 2 x 4 rolling 21.2 / 22.4 us against 1 x 16 x 1's 22.1 /
    # 23.0 on an H100) against xsmem CTAs with other split counts
    run timeout 80 python3 tests/bench_w4a16.py --m 8,5 --shapes 8192x8192,8192x2048 --cta 1x8x1,1x16x1 --splits 1,2,4 \
      --load xsmem ;;
w49) # v49's follow-up rule (packed weights on 1 x 16 x 1 too; 5..8 rows keep 2 x 2 x 4 where its 64-row CTAs fill one
    # wave): the rule's GPU tests, then issue 15's one-row / 16-row ratio on the new default
    nvidia-smi -L >>$L
    run timeout 150 $P -n 8 tests/test_gpu_w4a16.py -k "auto_takes or x_from_shared_memory_in_a_cuda_graph"
    run timeout 60 python3 tests/bench_w4a16.py --m 1,16 --shapes 8192x8192,14336x4096,4096x14336 ;;
v49) # session 49's CTA rules (x48's runs): xsmem on 1 x 16 x 1 for wide weights at 5..16 rows (long ones at any K), on
    # 1 x 8 x 1 for narrow ones with K >= 4096, int8 too. The new tests, then "auto" against the former CTAs where the
    # rule moved them without a measured row: 8192 x 8192 (not moved at 5..8 rows), 14336 x 2048, the packed layout
    nvidia-smi -L >>$L
    run timeout 150 $P -n 8 tests/test_gpu_w4a16.py -k "auto_takes or x_from_shared_memory_in_a_cuda_graph"
    run timeout 100 python3 tests/bench_w4a16.py --m 8,5 --shapes 8192x8192,4096x4096,14336x2048,8192x2048,2048x8192 \
      --cta auto,2x2x4,1x1x8,1x16x1 --load auto
    run timeout 80 python3 tests/bench_w4a16.py --m 16,9 --shapes 14336x2048,8192x2048,128256x2048 --cta auto,2x2x4 --load auto
    run timeout 80 python3 tests/bench_w4a16.py --m 16,9 --shapes 8192x8192,14336x4096,4096x14336 --pack on \
      --cta 2x8x1,2x4x1,1x16x1 --load xsmem
    run timeout 60 python3 tests/bench_w4a16.py --m 16,9 --shapes 2048x8192,2048x4096,2048x14336 --cta auto,1x1x8 --load auto ;;
q47) # the first look at p47 (what a short budget allows): 16 rows with and without the L2 bursts, then their tests
    nvidia-smi -L >>$L
    run timeout 60 python3 tests/bench_w4a16.py --m 16 --shapes 8192x8192 --cta 2x8x1 \
      --load xsmem,xsmem+prefetch2,xsmem+prefetch,xsmem+prefetch8
    run timeout 50 python3 tests/bench_w4a16.py --m 16 --shapes 2048x8192 --cta 1x8x1 --load xsmem,xsmem+prefetch,xsmem+prefetch8
    run timeout 100 $P -n 8 tests/test_gpu_w4a16.py -k "x_from_shared_memory and prefetch or auto_takes" ;;
p47) # session 47's L2 bursts on the xsmem path ("xsmem+prefetch[<steps>]": each weight row's next steps requested into L2
    # at once, so they reach DRAM as one run a row; CPU-compiled only): the GPU tests, then bursts of 2 / 4 / 8 steps
    # against none on the default CTAs (16 rows: 8192 x 8192 22.5 us, H200, against 14.4 at one row)
    nvidia-smi -L >>$L
    run timeout 200 $P -n 8 tests/test_gpu_w4a16.py -k "x_from_shared_memory"
    L4="xsmem,xsmem+prefetch2,xsmem+prefetch,xsmem+prefetch8"
    run timeout 120 python3 tests/bench_w4a16.py --m 16,9 --shapes 8192x8192,14336x4096 --cta 2x8x1 --load $L4
    run timeout 60 python3 tests/bench_w4a16.py --m 16 --shapes 4096x14336 --cta 2x4x1 --load $L4
    run timeout 60 python3 tests/bench_w4a16.py --m 16 --shapes 2048x8192 --cta 1x8x1 --load $L4
    run timeout 60 python3 tests/bench_w4a16.py --m 8,2 --shapes 8192x8192 --cta auto,2x8x1 --load auto,$L4 ;;
m47) # the minimal check of session 47's narrow xsmem rule (budget left for ~2 minutes of work)
    nvidia-smi -L >>$L
    run timeout 100 $P -n 8 tests/test_gpu_w4a16.py -k "auto_takes"
    run timeout 60 python3 tests/bench_w4a16.py --m 16,9 --shapes 2048x8192,2048x14336 --load auto,rolling ;;
v47) # session 47: xsmem_cta now sends NVFP4 at 9..16 rows over weights of < 4096 rows (K >= 4096) to 1 x 8 x 1 CTAs
    # (y46, H200: 2048 x 8192 at 16 rows 8.7 us against 15.1 on the former rule). Its tests, the rule against the former
    # (rolling: the former CTAs); the int8-KV rule's two CTAs a SM where a split would take > 8k keys (b8 x 32k: 4
    # splits now) and the rows it moves; int8 at 5..8 rows vs quack; K = 2048 weights on xsmem CTAs
    nvidia-smi -L >>$L
    run timeout 150 $P -n 8 tests/test_gpu_w4a16.py -k "x_from_shared_memory or auto_takes"
    run timeout 150 python3 tests/bench_w4a16.py --m 16,9 --shapes 2048x8192,1024x4096,2048x4096,2048x14336 \
      --load auto,rolling --pack off,on
    for row in "--b 8 --sk 32768" "--b 8 --sk 32768 --splits 2" "--b 16 --sk 32768" "--b 16 --sk 32768 --splits 1" \
               "--b 8 --sk 131072" "--b 8 --sk 131072 --splits 2"; do
      run timeout 40 python3 tests/bench_decode_int8kv.py $row --d 128
    done
    run timeout 60 python3 tests/bench_w4a16.py --m 5,6,8 --shapes 8192x8192,4096x4096
    # xsmem at 5..8 rows on 2 x 8 x 1 CTAs at the planner's splits (y46, H200, 8 rows: 8192 x 8192 20.2 us against the
    # default's 21.9, 14336 x 4096 19.2 against 23.1; the H100 in session 46 had 8192 x 8192 at 24.9 against 24.2)
    run timeout 120 python3 tests/bench_w4a16.py --m 5,8 --shapes 8192x8192,14336x4096,128256x4096 --cta auto,2x8x1 \
      --load auto,xsmem
    run timeout 120 python3 tests/bench_w4a16.py --m 16,9 --shapes 8192x2048,2048x2048,512x2048 --cta auto,1x8x1,2x4x1 \
      --load auto,xsmem ;;
y46) # two CTAs a SM first (16 warps: session 46's ncu found 8 warps at 4.7 cycles an issued instruction, DRAM at 48%),
    # then xsmem where it is not the default yet: 2..8 rows, and the 2048-row weights at 16 rows with more splits
    nvidia-smi -L >>$L
    run timeout 150 python3 tests/bench_w4a16.py --m 16 --shapes 8192x8192,14336x4096 --cta 1x8x1,2x8x1 --splits 4,8 \
      --load xsmem,xsmem+2ctas
    run timeout 150 python3 tests/bench_w4a16.py --m 8,2 --shapes 8192x8192,14336x4096 --cta auto,4x2x1,2x8x1 \
      --splits 2,4 --load auto,xsmem,xsmem+2ctas
    run timeout 120 python3 tests/bench_w4a16.py --m 16 --shapes 2048x8192,8192x2048 --cta auto,2x4x1,1x8x1 --splits 4,8 \
      --load auto,xsmem,xsmem+2ctas ;;
x46) # session 46 after d46 (xsmem: 40 of 43 GPU tests passed, the 3 others a test's K of 200; 16 rows 7-13% faster
    # than rolling on the large NVFP4 shapes, H100): the new default (`xsmem_cta`), the split-K reduce as a PDL
    # dependent, both layouts; then fp8's plain-buffer decode step (e46's last line)
    nvidia-smi -L >>$L
    run timeout 200 $P -n 8 tests/test_gpu_w4a16.py -k "x_from_shared_memory or auto_takes or pdl_chain or forced_splits or cuda_graph_capture"
    run timeout 150 python3 tests/bench_w4a16.py --m 16,9 --shapes 8192x8192,14336x4096,4096x14336 --load auto,rolling --pack off,on
    for pdl in 0 1; do FA4_INDUCTOR_W4A16_PDL=$pdl run timeout 40 python3 tests/bench_w4a16.py --m 16 --shapes 2048x8192,4096x14336 --load auto; done
    run timeout 130 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-prefill \
      --quant-e2e-runs fp8:ours,fp8:plain --quant-prompt 4096 ;;
d46) # session 46, issue 15's 16 rows: the new "xsmem" load path (x's CTA range copied to shared memory once, read
    # 16 bytes a lane as the MMAs need it: no register set of x, so 2-3 weight sets fit; CTAs of one K warp). Its GPU
    # tests first, then timed against the rolling path (auto CTAs), at 16 rows and at 2 / 8
    nvidia-smi -L >>$L
    run timeout 240 $P -n 8 tests/test_gpu_w4a16.py -k "x_from_shared_memory"
    run timeout 100 python3 tests/bench_w4a16.py --m 16,8 --shapes 8192x8192,14336x4096,8192x2048 --pack on
    run timeout 240 python3 tests/bench_w4a16.py --m 16 --shapes 8192x8192,14336x4096,8192x2048 --pack on \
      --cta 2x4x1,2x8x1,4x2x1 --splits 2,4,8 --load xsmem,xsmem:3 ;;
p45) # after e45 (fp8 decode step: ours 2.513 against default compile's 2.475 ms/token on the H100, though the kernel rows
    # favour ours): where each step's GPU time goes under both backends, and the fp8 kernel rows on the Llama-1B shapes
    nvidia-smi -L >>$L
    run timeout 120 $P -n 4 tests/test_gpu_fp8.py      # the K >= 2N rule (SCALED_MM_SLOW_K), after e45
    run timeout 100 python3 tests/bench_fp8.py --m 1 --shapes 2048x2048,512x2048,8192x2048,2048x8192
    run timeout 240 python3 docs/scripts/decode_profile.py fp8
    run timeout 200 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-prefill \
      --quant-e2e-runs fp8:default,fp8:ours --quant-prompt 4096 ;;
e45) # after f45: the fp8 model tier case, then the decode step end to end (Llama-1B shape, 4k cache) with torchao's
    # fp8 x fp8 config (per row) under default compile and ours, beside bf16 under ours
    run timeout 200 $P tests/test_gpu_models.py -k "quantized_weights_generate and fp8"
    run timeout 380 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-prefill \
      --quant-e2e-runs bf16:ours,fp8:default,fp8:ours --quant-prompt 4096 ;;
n45) # session 45, issue 15's 16 rows (8192 x 8192 NVFP4: 27.2 us packed against 14.5 at one row, H200): where the
    # tensor-core kernel's warps wait, never measured above one row (session 14 at one row: 0.68 eligible warps a
    # scheduler, 62% of issue slots idle). Stall reasons a kernel and SASS hot spots, 2 and 16 rows, auto and 4x1x8
    nvidia-smi -L >>$L
    S="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
    for m in 2 16; do
      run timeout 150 ncu --clock-control none --profile-from-start off --set full \
        -o $OUT/w$m python3 docs/scripts/ncu_w4a16.py 8192 8192 --m $m --mma auto,rolling@4x1x8
      run timeout 60 ncu --import $OUT/w$m.ncu-rep --page details --print-units base --csv \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats
      ncu --import $OUT/w$m.ncu-rep --page source --print-source sass --csv > $OUT/w${m}_sass.csv 2>>$L
      run python3 docs/scripts/sass_hotspots.py $OUT/w${m}_sass.csv 30
      rm -f $OUT/w${m}_sass.csv
    done
    run timeout 90 ncu --clock-control none --profile-from-start off --metrics "$S" \
      python3 docs/scripts/ncu_w4a16.py 8192 8192 --m 16 --mma auto,rolling@4x1x8 ;;
h43) # session 43's split rule on the H200: issue 16's kernel rows (b1 x 32k <= 21 us, b8 x 32k >= 1.85x), b1 x 4k / 128k,
    # then the end-to-end int8-KV decode (Llama-1B shape, batch 8 x 32k: >= 1.45x the bf16 cache's tokens/s)
    nvidia-smi -L >>$L
    for row in "--b 1 --sk 32768 --d 128" "--b 8 --sk 32768 --d 128" "--b 1 --sk 4096 --d 128" "--b 1 --sk 131072 --d 128" \
               "--b 8 --sk 32768 --d 64" "--b 64 --sk 4096 --d 128"; do
      run timeout 60 python3 tests/bench_decode_int8kv.py $row
    done
    # the fused combine (the last CTA merges; lost at 33 splits: 28.1 against 25.2 us) at the new rule's 16 splits
    FA4_INDUCTOR_DECODE_FUSED_COMBINE=1 run timeout 60 python3 tests/bench_decode_int8kv.py --b 1 --sk 32768 --d 128
    run timeout 300 python3 -m fa4_inductor bench --suite int8kv ;;
p43) # the bf16 decode kernel's split rule (one CTA a SM at every head dim) against two CTAs a SM, in alternating rounds:
    # the int8-KV kernel measured two a SM faster at head dim 64 (b1 x 32k 13.5 against 15.8 us, H100), and the bf16
    # kernel's b1 x 32k d64 reads at only 2.4 TB/s on the H100 (27.6 us)
    nvidia-smi -L >>$L
    run timeout 300 python3 scratch/split_pairs.py bf16 ;;
w43) # issue 15, "never slower than bf16 cuBLAS where dispatched": NVFP4 over 2048 x 8192 at 9..16 rows (H200, session
    # 43: 15.2-17.0 us against bf16's 14.6-15.1) runs 32-row 1 x 2 x 4 CTAs split in 2 (64 CTAs); 16-row CTAs (1 x 1 x 8,
    # 128 CTAs unsplit, what 2..8 rows and int8 use: int8 at 16 rows 11.2 us) were never timed there at 9..16 rows
    nvidia-smi -L >>$L
    run timeout 200 python3 tests/bench_w4a16.py --m 9,12,16 --cta auto,1x1x8,1x2x4 --load auto --pack off,on \
      --shapes 2048x8192,2048x2048,8192x2048 ;;
s43) # with one CTA a SM at head dim 128 (session 43's rule) the ring could be twice as deep: the int8-KV sweep of
    # split counts x shared-memory budgets (56..220 KB; FA4_INDUCTOR_DECODE_SMEM_KB, default 100: 5 stages) at the
    # default register bound, head dim 128. If a deeper ring wins at the rule's counts, make the budget follow the rule
    nvidia-smi -L >>$L
    run timeout 500 python3 tests/bench_decode_int8kv.py --sweep --d 128 --min-ctas 0 ;;
s42a) # session 42, any Hopper: the demo (issue 12: >= 1.0x default compile; H200 rows only so far)
    nvidia-smi -L >>$L
    run timeout 300 python3 -m fa4_inductor demo ;;
s42b) # the size sweep's smallest Llama (host-bound rows, where routing to the faster kernel matters) on this GPU
    MODELS=256x2 LIMIT=520 bash scratch/sweep_all.sh >>$L 2>&1 ;;
h41a) # session 41, first call after the install (H200 wanted): h40a, then issue 16's b1 x 32k broken down (main kernel
    # and combine by profiler, graph medians at 16 / 33 / 66 splits; the fused combine against the kernel) and the b8 row
    nvidia-smi -L >>$L
    run timeout 120 python3 docs/scripts/read_floor.py
    run timeout 100 python3 tests/bench_w4a16.py --m 1 --shapes 8192x8192,2048x8192,8192x2048
    run timeout 60 python3 tests/bench_decode_int8kv.py --b 8 --sk 32768 --d 128
    run timeout 60 python3 tests/bench_decode_int8kv.py --b 1 --sk 32768 --d 128
    run timeout 120 python3 docs/scripts/decode_kernel_times.py 1 32768 128 8,12,16,24,66
    FA4_INDUCTOR_DECODE_FUSED_COMBINE=1 run timeout 60 python3 tests/bench_decode_int8kv.py --b 1 --sk 32768 --d 128 ;;
h41b) # the rest of h40b: both decode kernels' DRAM counters at b8 x 32k, then the 9..16-row packed half
    nvidia-smi -L >>$L
    run timeout 150 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
      --section MemoryWorkloadAnalysis python3 docs/scripts/ncu_decode_int8kv.py 8 32768 128
    run timeout 200 python3 tests/bench_w4a16.py --m 2,8,9,16 --load auto --pack off,on \
      --shapes 8192x8192,2048x8192,8192x2048,14336x4096,4096x14336 ;;
h40a) # issue 15 on the H200 (the H100's rows are session 39's): the fastest read of the NVFP4 bytes beside our one-row
    # GEMV. Is 8192 x 8192 in 11 us within the device's reach? (quack's gated MLP ran in session 40 on an H100: no rewrite)
    nvidia-smi -L >>$L
    run timeout 120 python3 docs/scripts/read_floor.py
    run timeout 100 python3 tests/bench_w4a16.py --m 1 --shapes 8192x8192,2048x8192,8192x2048 ;;
h40b) # issue 16 on the H200: b8 / b1 x 32k d128 (1.81x against 1.85x; 25.5 us against 21), then both decode kernels'
    # DRAM counters at b8 x 32k (the H100: int8-KV 87.2% of peak, bf16 89.8%), then b38's 9..16-row half
    nvidia-smi -L >>$L
    run timeout 60 python3 tests/bench_decode_int8kv.py --b 8 --sk 32768 --d 128
    run timeout 60 python3 tests/bench_decode_int8kv.py --b 1 --sk 32768 --d 128
    run timeout 150 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
      --section MemoryWorkloadAnalysis python3 docs/scripts/ncu_decode_int8kv.py 8 32768 128
    run timeout 200 python3 tests/bench_w4a16.py --m 2,8,9,16 --load auto --pack off,on \
      --shapes 8192x8192,2048x8192,8192x2048,14336x4096,4096x14336 ;;
a38) # session 37's opened nn.TransformerEncoderLayer (lowering/encoder_layer.py, on by default, never timed): its GPU
    # test, then BERT-base-shaped stacks against default compile (which keeps the fused call), with how many layers
    # reached the op. If ours is slower on a row, route (or stop opening) where it loses. Fits after the install
    run timeout 120 $P tests/test_encoder_layer.py
    run timeout 200 python3 docs/scripts/encoder_stack.py 8 512
    run timeout 140 python3 docs/scripts/encoder_stack.py 1 128 ;;
b38) # the packed layout's 4 x 1 x 8 CTA numerics (bit for bit), then session 37's rules on the H200 (sessions 36-37
    # measured the H100 only): one and four rows, then 2..16 rows plain and packed
    run timeout 150 $P -n 8 tests/test_gpu_w4a16.py -k "forced_cta_shapes or rolling_loads"
    run timeout 100 python3 tests/bench_w4a16.py --m 1,4 --shapes 8192x8192,2048x8192,8192x2048
    run timeout 250 python3 tests/bench_w4a16.py --m 2,8,9,16 --load auto --pack off,on \
      --shapes 8192x8192,2048x8192,8192x2048,14336x4096,4096x14336 ;;
c38) # the model tier (last full run session 35) after sessions 36-38's lowering changes, then issue 15's read floor
    # (docs/scripts/read_floor.py: the fastest read of an NVFP4 weight's bytes, bf16 cuBLAS over the same bytes, ATen
    # row sums, a Triton stream, timed as bench_w4a16 times ours): if the floor is near 11 us at 8192 x 8192, the
    # one-row target is the device's limit
    run timeout 300 $P -n 8 tests/test_gpu_models.py
    run timeout 200 python3 docs/scripts/read_floor.py ;;
f38) # (ran in session 39 on an H100; the unroll switch is removed since) issue 16's b8 x 32k (1.81x the bf16 kernel against 1.85x; 4.09 TB/s against its 4.4) and b1 x 32k (25.5 us
    # against 21): sm_90a SASS says the int8-KV kernel issues 2-3x the bf16 kernel's instructions a byte from 8 warps a
    # SM. First FA4_INDUCTOR_DECODE_UNROLL=2 (two KV tiles an iteration, for ptxas to overlap one tile's P V with the
    # next one's Q K^T: int8-KV 218 registers, bf16 167, no spill), both kernels: bit for bit one tile an iteration,
    # then timed on the rows (bench_decode_int8kv times both; the bf16 kernel's b1 x 32k runs at ~3.5 TB/s
    # against 4.4 at b8, latency-bound too); then the int8 kernel's counters at b8 x 32k with the default
    run timeout 150 $P tests/test_gpu_decode_int8kv.py tests/test_gpu_decode.py -k "two_tiles"
    for u in 1 2; do
      for row in "--b 1 --sk 32768 --d 128" "--b 8 --sk 32768 --d 128" "--b 8 --sk 32768 --d 64" "--b 1 --sk 4096 --d 128"; do
        FA4_INDUCTOR_DECODE_UNROLL=$u run timeout 60 python3 tests/bench_decode_int8kv.py $row
      done
    done
    run timeout 200 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
      --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      --section InstructionStats python3 docs/scripts/ncu_decode_int8kv.py 8 32768 128 ;;
p37) # session 37, after g37 (2 row tiles a warp at 16 rows: 32.8 against 47.3 us on 8192 x 8192): more row tiles, and
    # the packed NVFP4 layout, which fits them in fewer registers (sm_90a SASS, rolling at 16 rows: 2x2x4 176 -> 148
    # registers; 4x1x8 255 with 4 local accesses a loop -> 212 without, 13.2 -> 11.3 instructions a MMA; 3x2x4 255 with
    # 6 -> 176 without)
    run timeout 200 python3 tests/bench_w4a16.py --m 16 --cta 2x2x4,4x1x8,3x2x4 --load rolling --pack off,on \
      --shapes 8192x8192,8192x2048,14336x4096,4096x14336
    run timeout 100 python3 tests/bench_w4a16.py --m 8 --cta 2x2x4,4x1x8 --load rolling --pack off,on \
      --shapes 8192x8192,8192x2048,14336x4096,4096x14336 ;;
g37) # session 37: the MHA GPU tests (fixed: session 36's test took the grad of a non-leaf), the decode GEMM's shape
    # tiers under the new default (NVFP4 at 9..16 rows on 2 x 2 x 4 CTAs, rolling), then its times against the old
    # default (1 x 2 x 4, rolling+2ctas), and int8 at 2 and 8 rows over 8192-row weights against quack (now ours)
    run timeout 150 $P tests/test_multihead_attention.py
    run timeout 150 $P -n 8 tests/test_gpu_w4a16.py -k "test_shapes or a_large_weight or cuda_graph_capture_and_replay"
    run timeout 150 python3 tests/bench_w4a16.py --m 9,16 --cta auto,1x2x4 --load auto \
      --shapes 8192x8192,2048x8192,8192x2048,14336x4096,4096x14336
    run timeout 80 python3 tests/bench_w4a16.py --m 2,8 --load auto --shapes 8192x8192,8192x2048,14336x4096 ;;
m36) # session 36, issue 12 (the training step at ~59 ms, its GEMMs at cuBLAS's rate): one Llama MLP layer forward and
    # backward at 4096 tokens under default compile, against quack's gated MLP (SiLU x up in the GEMM epilogues): if
    # quack's rows save ~0.1 ms a layer or more, a training rewrite of the gated MLP onto it is worth building
    run timeout 300 python3 docs/scripts/mlp_fusion.py ;;
z36) # session 36: first the numerics of the CTA shapes c36 sweeps (2 and 4 row tiles a warp at 9..16 rows, bit for
    # bit the register path). Then FA4_INDUCTOR_W4A16_LOAD=auto (`w4a16_decode.auto_load`, measured on the H100
    # only) on the H200: the three load paths at 2..16 rows. Also read the quack int8 column: on the H100 our rolling path beat quack's
    # int8 GEMM at 2..8 rows over weights wider than 4096 rows (8192 x 8192 27.9 against 30.0 us, 8192 x 2048 7.9
    # against 9.5), which `int8_linear.w4a16_int8_shape_reason` sends to quack; if the H200 agrees, widen that rule
    run timeout 150 $P -n 8 tests/test_gpu_w4a16.py -k "forced_cta_shapes or rolling_loads"
    run timeout 150 $P tests/test_multihead_attention.py    # sessions 36-37: nn.MultiheadAttention opened onto the op (ViT, padded, DETR cross-attention)
    run timeout 200 python3 tests/bench_w4a16.py --m 2,8,16 --load registers,rolling,rolling+2ctas \
      --shapes 8192x8192,2048x8192,8192x2048,14336x4096,4096x14336
    ;;
c36) # session 36, after z36: two row tiles a warp at 16 rows (64-row CTAs, x read once for twice the rows): the
    # register path spills there (87 stores), the rolling one takes 176 registers without spills (sass_stats --cta 2x2x4); four (x bytes a
    # weight byte as at 8 rows on 2x2x4): NVFP4 255 registers, 2 local accesses a loop, 13.2 instructions a MMA (16.8 on
    # 1x2x4), packed 212 without spills, int8 172
    run timeout 260 python3 tests/bench_w4a16.py --m 16 --cta auto,2x2x4,4x2x4,4x1x8,1x4x2 --load rolling,rolling+2ctas \
      --shapes 8192x8192,8192x2048,14336x4096,4096x14336
    # and at 8 rows, four row tiles a warp (x a weight byte halved again; rolling: 178 registers, no spills)
    run timeout 100 python3 tests/bench_w4a16.py --m 8 --cta auto,4x2x4,4x1x8 --load rolling \
      --shapes 8192x8192,8192x2048,14336x4096,4096x14336
    ;;
n36) # session 36, after z36: the counters behind it, L2 -> L1 sectors and L1 hit rate at 16 rows (x's bytes) against
    # 8 rows, for the load paths and the 2x2x4 CTA
    for m in 8 16; do
      run timeout 150 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section MemoryWorkloadAnalysis --section WarpStateStats python3 docs/scripts/ncu_w4a16.py 8192 8192 --m $m \
        --mma registers,rolling,rolling+2ctas,rolling@2x2x4
    done ;;
e36) # session 36, after z36: the quantized decode step end to end (Llama-1B shape, 4k cache) with the auto load rule
    # against the register path
    for load in registers auto; do
      FA4_INDUCTOR_W4A16_LOAD=$load run timeout 170 python3 -m fa4_inductor bench --suite quant --quant-formats none \
        --quant-no-prefill --quant-e2e-runs int8:plain,nvfp4:plain --quant-prompt 4096
    done ;;
y36) # session 36, issue 15's "M = 16 within 15% of M = 1": the rolling load path (one register set refilled 16 bytes
    # at a time as the step uses it: NVFP4 at 16 rows 142 registers without spills against 255 with, at 8 rows 160
    # against 194; "+2ctas" caps them at 128 for two CTAs a SM). Its GPU tests (bit for bit the register path, and
    # the numerics tiers), then timed against the register path; then the GPU models tier's Gemma 2 training case
    run timeout 200 $P -n 8 tests/test_gpu_w4a16.py -k "rolling or every_m or splits_and_dtypes"
    run timeout 150 python3 tests/bench_w4a16.py --m 2,8,16 --load registers,rolling,rolling+2ctas \
      --shapes 8192x8192,2048x8192,8192x2048,4096x14336
    run timeout 90 $P -n 2 tests/test_gpu_models.py -k "training_step and gemma2"
    ;;
x35) # session 35, one call for what is left of a short budget: t34 (the integer int8 GEMV's GPU tests, then timed
    # against the fp32 GEMV at one row) and w35 (the decode GEMM's CTA shapes at 16 rows), trimmed
    run timeout 150 $P -n 8 tests/test_gpu_w4a16.py -k "int8_int_gemv"
    run timeout 120 python3 tests/bench_w4a16.py --m 1 --gemv on,int --shapes 8192x8192,2048x8192,8192x2048,4096x14336
    run timeout 120 python3 tests/bench_w4a16.py --m 16 --cta auto,1x8x1,2x4x1 --shapes 8192x8192,4096x14336,2048x8192
    ;;
w35) # session 35, issue 15's "M = 16 within 15% of M = 1" (8192 x 8192 NVFP4 at 16 rows: 50 us on the tensor-core
    # kernel, 2.2x its 8-row time). Suspect: x's bytes. The wide CTA at M = 16 is 1 x 2 x 4 (32 weight rows), so each
    # CTA reads 16 x K bf16 of x (32 bytes a K) for 18 bytes a K of NVFP4 weights: L2 -> SM traffic ~2.8x the weight
    # bytes. CTAs of more rows (1x8x1, 2x4x1: 128 rows, x 0.44x the weights) compile without spills (196 / 240
    # registers, sass_stats --cta). Sweep them at 16 rows
    run timeout 420 python3 tests/bench_w4a16.py --m 16 --cta auto,1x8x1,2x4x1,1x4x2 \
      --shapes 8192x8192,2048x8192,8192x2048,14336x4096,4096x14336 ;;
v34) # session 34, after t34: the int8-weight decode step (Llama-1B shape, 4k cache; session 13: 1.125 ms/token) with
    # the integer int8 GEMV on every one-row int8 linear (FA4_INDUCTOR_W4A16_INT_GEMV=on) against the default
    for on in 0 1; do
      FA4_INDUCTOR_W4A16_INT_GEMV=$([ $on = 1 ] && echo on || echo auto) run timeout 270 python3 -m fa4_inductor bench \
        --suite quant --quant-formats none --quant-e2e-runs int8:plain --quant-prompt 4096
    done ;;
u34) # session 34: the model-level GPU tier (tests/test_gpu_models.py, new, not yet run): Llama, Qwen 3, Mistral,
    # Gemma 2, Phi-3, GPT-2 at head dims 64 / 96 / 128 / 256 in bf16, prefill (left-padded or not), a right-padded
    # training step, static-cache generate with compiled decode steps (bf16, torchao int8 / NVFP4 weights), ours
    # against default compile against float32
    run timeout 560 $P -n 8 tests/test_gpu_models.py ;;
t34) # session 34, issue 15's int8 row (19.6 us at 8192 x 8192 against 18): the integer int8 GEMV (`int8_int_gemv`,
    # CPU-compiled only: dp4a on the weight bytes as they are, x quantized per 16-value block as the integer NVFP4
    # GEMV's; 142 loop instructions for 128 weights against the fp32 GEMV's 258 for 64, sm_90a SASS): its GPU tests,
    # then the fp32 GEMV ("on") against it ("int") at 1 and 2 rows. Where it wins, give `int8_int_gemv.int8_auto` the
    # rule (auto is off until then) and rerun issue 15's int8 rows
    run timeout 260 $P -n 8 tests/test_gpu_w4a16.py -k "int8_int_gemv"
    run timeout 300 python3 tests/bench_w4a16.py --m 1,2 --gemv on,int \
      --shapes 8192x8192,2048x8192,8192x2048,14336x4096,4096x14336,2048x2048,512x2048 ;;
r34) # session 34, issue 12's training step (59.1 ms of GPU a step against 55): ATen's CUDA embedding backward in
    # place of Inductor's decomposition (float32 zeros of [128256, 2048], index_put, a cast: 0.58 ms a step in session
    # 32), against the default in the same process order. If it wins, drop the decomposition in the backend (training
    # graphs on CUDA) and test it on the CPU
    run timeout 60 python3 docs/scripts/train_gemms.py   # session 35: each projection's three GEMMs, and q/k/v fused
    run timeout 200 python3 docs/scripts/train_profile.py sdpa 4096 fa4_inductor
    TRAIN_PROFILE_ATEN_EMBEDDING_BACKWARD=1 run timeout 200 python3 docs/scripts/train_profile.py sdpa 4096 fa4_inductor
    ;;
s34) # session 34: the training step under Inductor's max-autotune GEMM templates (Triton GEMMs with the pointwise
    # work after them fused in, chosen against cuBLAS by timing; compiles for minutes): does epilogue fusion, which
    # session 33's floor analysis says 55 ms needs, beat cuBLAS's 40.9 ms of GEMMs plus the separate kernels?
    run timeout 560 python3 docs/scripts/train_profile.py sdpa 4096 fa4_inductor@max-autotune-no-cudagraphs ;;
q33) # session 33: the rotary tables (on since session 32) in host-bound small models: the demo and the sweep's Llama
    # h256 x 2 rows (issue 12's >= 0.98x default compile and demo >= 1.0x), with the tables, then without (MIN_ELEMENTS
    # out of reach): if the small rows lose with them, raise rotary_tables.MIN_ELEMENTS to where they stop losing
    for m in 4096 1000000000; do
      run timeout 80 python3 -c "import sys; import fa4_inductor.lowering.rotary_tables as r; r.MIN_ELEMENTS = $m
from fa4_inductor import demo; sys.exit(demo.run())"
      run timeout 170 python3 -c "import fa4_inductor.lowering.rotary_tables as r; r.MIN_ELEMENTS = $m
from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=(), bert=False, seqlens=(128, 512, 2048), time_budget_s=150): print(t.markdown())"
    done ;;
p33) # session 33, after o32 (the ring measured slower and removed, register path restored) and n32 (the e2e suite cut
    # at 150 s): the GEMV tiers on the restored files, then prefill and decode end to end with the rotary tables
    run timeout 120 $P -n 8 tests/test_gpu_w4a16.py -k "gemv"
    run timeout 400 python3 -m fa4_inductor bench --suite e2e ;;
o32) # session 32: the GEMVs' weight pieces through a shared-memory ring by cp.async (FA4_INDUCTOR_GEMV_RING, off by
    # default, CPU-compiled only; d28: the integer GEMV holds ~53% of DRAM's peak with one eligible warp a scheduler,
    # 35% of its stalls on global loads, at the 16 warps a SM its registers allow): both GEMVs' bit-for-bit tests, then
    # issue 15's shapes by ring depth (integer GEMV for NVFP4, the CUDA-core GEMV for NVFP4 and int8; int8's target is
    # 18 us at 8192 x 8192, ~19.6 now). Turn the ring on where it wins (the GEMV rules), else record and drop it
    run timeout 150 $P -n 8 tests/test_gpu_w4a16.py -k "gemv_ring"
    run timeout 300 python3 tests/bench_w4a16.py --m 1 --gemv int,on --ring 0,4,3 --shapes 8192x8192,2048x8192,8192x2048
    ;;
n32) # session 32, after m32: the rotary tables from 4096 elements on (decode steps keep them inlined); the training step
    # timed over 10 steps (wall, and GPU time between CUDA events), then prefill and decode end to end (prefill reads
    # the tables too)
    run timeout 100 $P tests/test_rotary_tables.py
    run timeout 200 python3 docs/scripts/train_profile.py sdpa 4096 fa4_inductor,fa4_inductor:rotary_tables=0
    run timeout 120 python3 docs/scripts/train_profile.py eager 4096 fa4_inductor
    run timeout 150 python3 -m fa4_inductor bench --suite e2e ;;
m32) # session 32, issue 12's training step (61.2 ms wall, 57.4 of kernels against 55): the rotary tables computed once
    # (lowering/rotary_tables.py, on by default) against off, every kernel listed in $OUT; default compile for scale and
    # ours under reduce-overhead (what of the 3.8 ms of wall beyond the kernels is launch gaps); the GPU variant of the
    # rotary test; FA4 direct's column of the backward suite (its gradient's layout was wrong in l30)
    export TRAIN_PROFILE_KERNELS=$OUT
    run timeout 100 $P tests/test_rotary_tables.py
    run timeout 170 python3 docs/scripts/train_profile.py sdpa 4096 fa4_inductor,fa4_inductor:rotary_tables=0
    run timeout 170 python3 docs/scripts/train_profile.py sdpa 4096 fa4_inductor@reduce-overhead,inductor
    run timeout 120 python3 -m fa4_inductor bench --suite backward ;;
l30) # session 30, for issue 12's training target (62 ms against 55; GEMMs + FA4 are 50.2): FA4's forward + backward
    # against cuDNN's at Llama-1B's and Llama-8B's GQA shapes (route training attention to the faster one), then the
    # training step's kernels and the GPU's idle gaps between them (3.5 ms of wall beyond the kernels)
    run timeout 100 $P tests/test_gpu_fa4.py -k "dropout"   # session 30: hand-written dropout -> SDPA's, unrun
    run timeout 150 $P tests/test_gpu_decode.py -k "llama4_chunked"   # session 31: a computed one-row mask as key mask
    run timeout 200 python3 -m fa4_inductor bench --suite backward
    run timeout 150 python3 docs/scripts/train_profile.py sdpa 4096 fa4_inductor
    run timeout 150 python3 docs/scripts/train_profile.py eager 4096 fa4_inductor ;;
k30) # session 30: after i30 found the 16 memcpy32_post a step are one-sequence seqused_k clones (stride 0, now
    # restrided): the decode tiers (lengths and int8 scales restrided), then the NVFP4 decode step without and with
    # gated linears, twice each, alternating (i30 on one machine: 0.921 against 0.904; session 29: 0.925 against
    # 1.016), 64 timed steps a run
    run timeout 150 $P -n 8 tests/test_gpu_decode.py tests/test_gpu_decode_int8kv.py tests/test_gpu_int8kv.py
    for o in 0 1 0 1; do run timeout 100 python3 docs/scripts/decode_profile.py nvfp4 plain gated_linears=$o; done ;;
i30) # session 30: one-row activations with a row stride of 0 are restrided, not copied (`layout.packed_rows`: the 16
    # memcpy32_post a step were the down projection's x copied by `_pad_cols`); the step again, with gated linears
    # (session 29: slower by 34 us in the down projection, with that copy between), with lm_head quantized; then the
    # batch-8 int8-cache step by launching op (issue 16: cuBLAS's 8-row linears ~1.0 ms of a step)
    run timeout 130 python3 docs/scripts/decode_profile.py nvfp4 plain
    run timeout 130 python3 docs/scripts/decode_profile.py nvfp4 plain gated_linears=1
    run timeout 130 python3 docs/scripts/decode_profile.py nvfp4 plain lm_head=1
    run timeout 170 python3 docs/scripts/decode_profile.py int8kv attribute=1 ;;
j30) # session 30: the W4A16 GPU tier in full (session 29's runs were cut or partial), then eager code's packed
    # training (part g29 ran out of memory in default compile's step: it now reports that and goes on)
    run timeout 240 $P -n 8 tests/test_gpu_w4a16.py
    run timeout 280 python3 scratch/packed.py eager ;;
g29) # session 29: attention sinks (GPT-OSS; the op's out * sigmoid(lse - sink), training through FA4's dlse) and eager
    # code's packed training mask on FA4 varlen with blind rows' eager gradient (`blind_rows_gradients`), CPU-tested;
    # then the Llama-1B shape's packed training step, eager code (session 24: sdpa code 111.0 ms against 223.9)
    run timeout 200 $P -n 4 tests/test_gpu_fa4.py -k "sinks or packed_training or rows_that_see_no_key or per_query"
    run timeout 300 python3 scratch/packed.py eager ;;
h29) # session 29's lead for issue 15: 8 / 16-warp integer-GEMV CTAs (4x1x1x8 never lost on weights of >= 4096 rows;
    # 4x1x2x8 took 4096 x 14336 to 13.8 us from 16.8) on the shapes not yet measured, then the decode step's kernels
    # by the op that launched them (memcpy32_post, 16.4 us a step, is not attributed)
    run timeout 200 python3 tests/bench_w4a16.py --m 1 --shapes 14336x4096,128256x4096,8192x8192,4096x14336,4096x4096 \
        --gemv int,int:4x1x1x8,int:4x1x2x8,int:4x1x1x16
    run timeout 200 python3 docs/scripts/decode_profile.py nvfp4 plain attribute=1
    # the same step with lm_head quantized too (torchao's default filter quantizes every nn.Linear; the tied bf16
    # lm_head is 125 us of the step's 825): a second row beside the issue's, not a replacement
    run timeout 150 python3 docs/scripts/decode_profile.py nvfp4 plain lm_head=1 ;;
f29) # session 29: the CUDA-core GEMV with two weight pieces in flight (each_piece; 96 -> 132 registers at M = 1):
    # its tests (and the integer GEMV's, which now shares the loop), then one piece (HEAD's files) against two,
    # uncapped and capped at 4 CTAs a SM, then the NVFP4 decode step (its down projection runs this GEMV)
    run timeout 200 $P -n 8 tests/test_gpu_w4a16.py
    run timeout 100 python3 scratch/gemv_depth.py two 0,4
    mkdir -p /tmp/new && cp kernels/cute/w4a16_gemv.py kernels/cute/nvfp4_int_gemv.py /tmp/new/
    cp scratch/old_gemv/*.py kernels/cute/
    run timeout 70 python3 scratch/gemv_depth.py one 0
    cp /tmp/new/*.py kernels/cute/
    run timeout 120 python3 docs/scripts/decode_profile.py nvfp4 plain ;;
c28) # session 28: K split among a cluster's CTAs in both GEMVs (FA4_INDUCTOR_GEMV_SPLIT, off by default, CPU-compiled
    # only): its GPU tests, the shapes forced and by the rule, then the NVFP4 decode step with the integer GEMV split
    # for every one-row call (the down projection: 6.4 us on the fp32 GEMV, ~2.4 us of bytes)
    run timeout 240 $P -n 8 tests/test_gpu_w4a16.py -k "split_k or split_rule or int_gemv_shapes or gemv_shapes"
    run timeout 200 python3 tests/bench_w4a16.py --m 1 --shapes 2048x8192,4096x14336,1024x4096,4096x4096,8192x8192 \
        --gemv int,int:4x1x2,int:4x1x4,int:4x1x8,int:4x2x2,int:2x2x2,int:4x1x1x8,int:4x1x1x16,int:4x1x4x16,int:4x1x2x8,on,4x4x2,4x1x4
    run env FA4_INDUCTOR_GEMV_SPLIT=on timeout 120 python3 tests/bench_w4a16.py --m 1 \
        --shapes 2048x8192,4096x14336,1024x4096,4096x4096,8192x8192,8192x2048 --gemv int,on
    for s in off on; do run env FA4_INDUCTOR_GEMV_SPLIT=$s FA4_INDUCTOR_W4A16_INT_GEMV=on timeout 120 python3 \
      docs/scripts/decode_profile.py nvfp4 plain; done ;;
e28) # session 28: the gated integer GEMV (silu(x @ gate^T) * (x @ up^T) in one launch, CPU-compiled only) and
    # fa4::nvfp4_gated_linear: GPU tests, its time against the sibling GEMV and Inductor's silu product chained, the
    # NVFP4 decode step without and with `backend(gated_linears=True)` (on by default if faster)
    run timeout 200 $P -n 8 tests/test_gpu_w4a16.py -k "gated"
    run timeout 120 python3 scratch/gated_gemv.py
    for o in 0 1; do run timeout 120 python3 docs/scripts/decode_profile.py nvfp4 plain gated_linears=$o; done ;;
d28) # session 28: where the 16-warp CTAs and the splits change the integer GEMV's counters (8192 x 8192 and the down
    # projection): issue rate, warps a scheduler, the prologue's share
    for shape in "8192 8192 4,1,1,16 4,1,1,8" "2048 8192 4,1,4,4 4,1,4,16"; do
      run timeout 150 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section SchedulerStats --section InstructionStats python3 docs/scripts/ncu_w4a16.py \
        $shape; done ;;
a28) # session 28: the decode tiers (the int8 kernel at 2 CTAs a SM, start_cta, the fused combine's tests), then the
    # int8 rows without and with the fused combine (b64 d64 at 32k: 620.6 us before session 27, 727.5 after its run 7)
    run timeout 270 $P -n 8 tests/test_gpu_decode.py tests/test_gpu_decode_int8kv.py tests/test_gpu_int8kv.py
    for f in 0 1; do
      echo "+ FA4_INDUCTOR_DECODE_FUSED_COMBINE=$f" >>$L
      for r in "1 32768 128" "8 32768 128" "1 4096 128" "64 4096 64" "64 32768 64" "8 32768 64"; do set -- $r
        env FA4_INDUCTOR_DECODE_FUSED_COMBINE=$f timeout 60 python3 tests/bench_decode_int8kv.py --b $1 --sk $2 --d $3 \
          2>&1 | grep "^b" >>$L; done
    done ;;
b28) # session 28: the NVFP4 decode step without and with the fused combine, the int8 route (part q2)
    for f in 0 1; do run env FA4_INDUCTOR_DECODE_FUSED_COMBINE=$f timeout 120 python3 docs/scripts/decode_profile.py \
      nvfp4 plain; done
    run timeout 200 $P -n 8 tests/test_gpu_quant.py tests/test_gpu_w4a16.py -k "int8"
    run timeout 100 python3 scratch/sibling_gemv.py ;;
e)  # session 26 diagnostics: each decode kernel's GPU time at b1 (issue 16: b1 x 4k takes 13 us for 8 MB), hardware
    # counters of the integer NVFP4 GEMV at its 4x1 default (issue 15: 15-16 us against 11), the NVFP4 decode step's kernels
    run timeout 150 python3 docs/scripts/decode_kernel_times.py
    run timeout 90 python3 docs/scripts/decode_kernel_times.py 1 32768 128 16,24,48,66
    run timeout 120 ncu --clock-control none --profile-from-start off -c 1 --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        --section InstructionStats python3 docs/scripts/ncu_w4a16.py 8192 8192
    run timeout 200 python3 docs/scripts/decode_profile.py nvfp4 plain ;;
s)  # session 27's lead for issue 15: the down projection (2048 x 8192 NVFP4, one row) takes 6.4 us on the fp32 GEMV
    # (102 us a decode step) against a ~2.4 us byte floor; every integer-GEMV and fp32-GEMV CTA shape on it and its
    # neighbours (`--gemv int:RxK`: rows a warp x K warps)
    run timeout 300 python3 tests/bench_w4a16.py --m 1 --shapes 2048x8192,4096x14336,1024x4096 \
        --gemv int,int:4x1,int:4x2,int:2x2,int:1x2,int:1x4,int:2x1,int:1x1,on,1x1,1x2,1x4,2x1,2x2,2x4 ;;
r)  # session 27, after its runs: the fused combine (FA4_INDUCTOR_DECODE_FUSED_COMBINE=1, off by default, CPU-compiled
    # only): its GPU tests, then the b1 / b8 rows and the NVFP4 decode step without it and with it (turn it on if
    # faster everywhere; the b1 x 32k combine tail is ~4 us of 25)
    run timeout 300 $P -n 8 tests/test_gpu_decode.py tests/test_gpu_decode_int8kv.py -k "fused_combine"
    for f in 0 1; do
      echo "+ FA4_INDUCTOR_DECODE_FUSED_COMBINE=$f" >>$L
      for r in "1 32768 128" "8 32768 128" "1 4096 128" "1 32768 64" "8 32768 64"; do set -- $r
        env FA4_INDUCTOR_DECODE_FUSED_COMBINE=$f timeout 60 python3 tests/bench_decode_int8kv.py --b $1 --sk $2 --d $3 \
          2>&1 | grep "^b" >>$L; done
      run env FA4_INDUCTOR_DECODE_FUSED_COMBINE=$f timeout 120 python3 docs/scripts/decode_profile.py nvfp4 plain
    done ;;
q)  # session 27, after its runs: the int8-KV kernel compiled for 2 CTAs a SM (launch bounds; part `p`: ptxas had
    # squeezed the d64 loop to 101 registers, 307 instructions, b64 x 32k 727.5 us against 620.6 before the session's
    # changes), both decode kernels after the start_cta refactor (SASS-checked only), the int8 one-row route to the
    # GEMV. Before the call, here:  mkdir -p scratch/old_decode && for f in decode_attention decode_attention_int8kv \
    #   decode_combine; do git show 3bc9a4c:kernels/cute/$f.py > scratch/old_decode/$f.py; done
    run timeout 300 $P -n 8 tests/test_gpu_decode.py tests/test_gpu_decode_int8kv.py tests/test_gpu_int8kv.py
    bash scratch/old_vs_new_decode.sh
    run timeout 200 python3 tests/bench_decode_int8kv.py ;;
q2) # session 27, after `q`: the int8 route (one-row linears over 4096..16384-row weights now on the GEMV), end to end
    run timeout 200 $P -n 8 tests/test_gpu_quant.py tests/test_gpu_w4a16.py -k "int8"
    run timeout 120 python3 scratch/sibling_gemv.py
    run timeout 240 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-prefill \
        --quant-e2e-runs int8:plain,nvfp4:plain --quant-prompt 4096
    run timeout 200 python3 docs/scripts/decode_profile.py int8kv ;;
o)  # session 27: the combine resident under PDL (registers <= 85, launched as the main kernel starts) and its passes:
    # GPU decode tiers, each kernel's time (part `m`), the int8 table, the old kernels (3bc9a4c) against these on five
    # rows (b64 d64 ran 716 us at 32k against session 8's 625), the NVFP4 decode step and the int8-cache step
    run timeout 300 $P -n 8 tests/test_gpu_decode.py tests/test_gpu_decode_int8kv.py tests/test_gpu_int8kv.py
    run timeout 150 python3 docs/scripts/decode_kernel_times.py ;;
p)  # session 27: after `o`
    run timeout 200 python3 tests/bench_decode_int8kv.py
    bash scratch/old_vs_new_decode.sh
    run timeout 120 python3 docs/scripts/decode_profile.py nvfp4 plain
    run timeout 200 python3 docs/scripts/decode_profile.py int8kv ;;
m)  # session 27: the decode kernels with Q's loads ahead of the KV prologue (part `l`: behind it they waited 13-25% of
    # the CTA's life) and the merge a row a thread: GPU tests, each kernel's time (session 26 run 1), the int8 table
    run timeout 300 $P -n 8 tests/test_gpu_decode.py tests/test_gpu_decode_int8kv.py tests/test_gpu_int8kv.py
    run timeout 150 python3 docs/scripts/decode_kernel_times.py ;;
n)  # session 27: after `m`, the int8-KV table and the NVFP4 decode step (session 26: 0.943 ms/step)
    run timeout 300 python3 tests/bench_decode_int8kv.py
    run timeout 150 python3 docs/scripts/decode_profile.py nvfp4 plain ;;
l)  # session 27: hardware counters of the decode kernels at b1 (issue 16's ~10 us floor): full set, SASS source view;
    # the floor at the same grid with almost no keys (256), and the main kernel alone at 4k / 32k split counts
    run timeout 200 ncu --clock-control none --profile-from-start off --set full -o $OUT/decode python3 docs/scripts/ncu_decode.py
    run timeout 60 ncu --import $OUT/decode.ncu-rep --page details
    ncu --import $OUT/decode.ncu-rep --page source --print-source sass --csv > $OUT/decode_sass.csv 2>>$L
    run timeout 100 python3 docs/scripts/decode_kernel_times.py 1 256 128 1,8,32 ;;
k)  # session 26: packed-sequence masks with rows that see no key (Llama 4's chunks left-padded) as FA4 varlen with used
    # lengths, CPU-tested only; its GPU test (the flag set in the test), then the other per-query kinds as a check
    run timeout 200 $P -n 8 tests/test_gpu_fa4.py -k "per_query_mask_over_a_static_cache or padding_runs_fa4" ;;
jt)  # session 27: part j's tests only
    run timeout 200 $P -n 8 tests/test_gpu_w4a16.py -k "siblings or sibling_linears or gemv" ;;
j)  # session 26: fa4::int8_sibling_linears (W4A16GemvSiblings) and the fp32 GEMV after its refactor: GPU tests, the probe
    # (NVFP4 and int8 groups), the quant suite's int8 and NVFP4 decode (session 13: int8 1.125 ms/token)
    run timeout 200 $P -n 8 tests/test_gpu_w4a16.py -k "siblings or sibling_linears or gemv"
    run timeout 120 python3 scratch/sibling_gemv.py
    run timeout 240 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-prefill \
        --quant-e2e-runs int8:plain,nvfp4:plain --quant-prompt 4096 ;;
i)  # session 26: fa4::nvfp4_sibling_linears (q/k/v and gate/up NVFP4 linears in one launch of the integer GEMV): its
    # GPU tests and the single-weight GEMV's after the refactor, the probe with the op, the NVFP4 decode step with the
    # grouping on and off
    run timeout 200 $P -n 8 tests/test_gpu_w4a16.py -k "siblings or sibling_linears or int_gemv"
    run timeout 120 python3 scratch/sibling_gemv.py
    run timeout 120 python3 docs/scripts/decode_profile.py nvfp4 plain
    run timeout 120 python3 docs/scripts/decode_profile.py nvfp4 plain nvfp4_sibling_linears=0 ;;
h)  # session 26: one GEMV over sibling weights against today's PDL-chained calls (issue 15's decode step); the int8-KV
    # kernel at b1 x 32k d128 with 3 CTAs a SM and a split count that fits one wave (session 25's 64 KB run had 50
    # splits: 400 CTAs on 396 slots)
    run timeout 150 python3 scratch/sibling_gemv.py
    for cfg in "100 0 33" "64 3 44" "64 3 49" "48 4 64" "48 4 66"; do set -- $cfg
      echo "+ SMEM_KB=$1 MIN_CTAS=$2 splits $3" >>$L
      FA4_INDUCTOR_DECODE_SMEM_KB=$1 FA4_INDUCTOR_DECODE_MIN_CTAS=$2 timeout 100 \
        python3 tests/bench_decode_int8kv.py --b 1 --sk 32768 --d 128 --splits $3 2>&1 | grep "^b" >>$L
    done ;;
g)  # session 26: split counts at short caches (`e`: b1 x 4k int8 32 splits, 2 tiles a warp, main 11.0 + combine 5.4 us;
    # the NVFP4 decode step's attention 3.9 + combine 2.9 us a layer at 4k), both kernels, then that step with a fixed count
    for sk in 1024 4096 8192; do for d in 64 128; do
      run timeout 100 python3 docs/scripts/decode_kernel_times.py 1 $sk $d 2,4,8,16,32; done; done
    for n in 4 8 16; do run timeout 100 env FA4_INDUCTOR_DECODE_SPLITS=$n python3 docs/scripts/decode_profile.py nvfp4 plain; done ;;
f)  # session 26: the int8 cache's decode step against the bf16 cache's (issue 16's end to end, last run session 9), the
    # bf16-weight step (issue 15's comparison)
    run timeout 300 python3 docs/scripts/decode_profile.py int8kv
    run timeout 200 python3 docs/scripts/decode_profile.py nvfp4 bf16 ;;
a)  # session 24: h2048 x 4's unpadded b8 x 128 prefill ran 0.94x and 0.97x (h2048 x 16's same row: 1.10x). Its graph
    # has ~125 GFLOP an attention, just over LAYER_GFLOP_HOST_BOUND (100), so the op runs its 0.27-GFLOP attentions.
    # The row for both depths with the line at 100 (the op) and at 150 (SDPA as written), then each backend's kernels
    # by GPU time against its wall time (host-bound if the wall is well above the kernels' sum)
    run timeout 300 python3 -c "
from fa4_inductor import bench
from fa4_inductor.lowering import crossover
for line in (100.0, 150.0):
    crossover.LAYER_GFLOP_HOST_BOUND = line
    for t in bench.sweep_suite(llama_sizes=((2048, 4), (2048, 16)), decode_sizes=(), bert=False, batches=(8,), seqlens=(128,), time_budget_s=120): print('LAYER_GFLOP_HOST_BOUND', line, t.markdown(), flush=True)
"
    run timeout 200 python3 -c "
import torch, time
from fa4_inductor.bench import models, sweep
from torch.profiler import profile, ProfilerActivity
model = models.llama('sdpa', 'cuda', torch.bfloat16, **models.llama_shape(2048, 4))
sm = sweep.SweepModel('llama', (), decode=False)
tokens = torch.randint(1, model.config.vocab_size, (8, 128), device='cuda')
for name, backend in models.BACKENDS.items():
    torch._dynamo.reset()
    call, _ = sweep.prefill_call(models.compile_model(model, backend), sm, tokens, None)
    with torch.no_grad():
        for _ in range(5): call()
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(20): call()
        torch.cuda.synchronize(); print(name, 'wall ms', round((time.perf_counter() - t) / 20 * 1e3, 3), flush=True)
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(5): call()
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by='cuda_time_total', row_limit=12), flush=True)
" ;;
1)  # session 20: the GPU tests of the key mask per query row (FA4 over a static cache's prefix, the fallback, FSDP's
    # training mask), the integer GEMV's prefetch window (session 19: output bit-equal to without) and int8 x int8 with
    # the cast and scaling in the graph (session 19); then a left-padded prefill into a static cache with generate's
    # [B, 1, S, 2S] mask against the same batch with the [B, S] mask and without one (sdpa code, prefill only)
    run timeout 150 $P -n 12 tests/test_gpu_w4a16.py tests/test_gpu_quant.py tests/test_gpu_fa4.py \
        -k "int_gemv or int8_int8 or int8_dynamic or per_query or padding_runs_fa4"
    run timeout 220 python3 -c "from fa4_inductor import bench
for t in bench.padded_suite(attentions=('sdpa',), passes=('prefill',), sides=('left',)): print(t.markdown())" ;;
r)  # session 21: `q` showed FA4 varlen on every layer of the static-cache padded prefill, each layer re-reading
    # the mask on the host (a new view per layer); `fa4::key_mask` now hands every layer one tensor. Its GPU tests,
    # then the three padded rows (`p`)
    run timeout 120 $P -n 8 tests/test_gpu_fa4.py -k "per_query or padding_runs_fa4 or key_mask"
    bash scratch/next_gpu.sh p ;;
s)  # session 21: the Llama-1B shape's rows that run 4 could not give (padded prefill: recompile limit, now 24;
    # decode: time budget), batch 8 x 2048
    run timeout 520 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((2048, 16),), decode_sizes=((2048, 16),), bert=False, batches=(8,), seqlens=(512, 2048, 8192), time_budget_s=420): print(t.markdown())" ;;
w)  # session 22: the decode kernel's additive key mask (eager code's mask input, `additive_masks_on_op`), never run
    # yet, and key-mask decode calls on our kernel below 512 keys (was: the SDPA fallback): their GPU tests, then eager
    # code's generate with the option on against off (run 4: 1086 tokens/s off, 904 default compile); if they pass
    # and it wins, turn the option on by default
    run timeout 200 $P -n 8 tests/test_gpu_decode.py -k "additive or key_mask or softcap or dispatch"
    run timeout 300 python3 -c "
import torch, fa4_inductor
from fa4_inductor.bench import llama_e2e, models
model = models.llama('eager', 'cuda', torch.bfloat16)
for name, backend in (('off', 'fa4_inductor'), ('on', fa4_inductor.backend(additive_masks_on_op=True))):
    torch._dynamo.reset()
    first, rate, _ = llama_e2e.generate_times(model, backend, 1024, 64, 4, 'cuda')
    print('eager code, generate b4 x 1024 + 64, additive_masks_on_op', name, '| first token', round(first, 1), 'ms |', round(rate), 'tokens/s', flush=True)
" ;;
w3) # session 23: `w` failed the SDPA fallback's prefill with an additive mask (zeros on rows whose visible keys are
    # all finfo.min: now floored) and ran generate at 90 tokens/s with additive_masks_on_op (a deep-copied backend
    # recompiled every generate: fixed); eager code's prefill mask now reaches FA4 with the option. GPU tests, then
    # aten SDPA on such rows, logits vs eager, prefill times and generate (scratch/w3.py)
    run timeout 200 $P -n 8 tests/test_gpu_decode.py tests/test_gpu_fa4.py -k "additive or key_mask or per_query or dispatch"
    run timeout 120 python3 scratch/w3.py sdpa
    run timeout 300 python3 scratch/w3.py prefill ;;
w4) # then generate, option off / on against default (scratch/w3.py)
    run timeout 500 python3 scratch/w3.py generate ;;
w5) # session 23 after w3/w4: the additive backward on the reference, SDPA with a floored mask (lowering's
    # sdpa_mask_input, option off) on rows of finfo.min, the option on by default
    run timeout 150 $P -n 8 tests/test_gpu_decode.py tests/test_gpu_fa4.py -k "additive or key_mask or per_query"
    run timeout 100 python3 scratch/w3.py sdpa
    run timeout 280 python3 scratch/w3.py prefill "ours, option off|ours (option on)" ;;
y)  # session 23: a sliding-window layer's prefill mask per query row read as FA4 varlen with its window (CPU-tested
    # only): its GPU tests, then a Mistral of the Llama-1B shape with a 1024 window (scratch/sliding.py)
    run timeout 150 $P -n 8 tests/test_gpu_fa4.py -k "per_query or additive"
    run timeout 400 python3 scratch/sliding.py ;;
z)  # session 23: packed sequences (position_ids) with run_time_masks on FA4 varlen (CPU-tested only): forward and a
    # training step, Llama-1B shape, 16 x 512 packed in 8192 (scratch/packed.py); if it wins, turn run_time_masks on
    run timeout 500 python3 scratch/packed.py ;;
c)  # session 24 (issue 12): eager code's padded training on the op (rows that see no key get eager's gradient from
    # `blind_rows_as_eagers`; was kept as written) and packed sequences within a sliding window as FA4 varlen: their GPU
    # tests, then a Llama-1B-shaped eager-code training step, 4 x 1024 left / right padded (scratch/eager_train.py)
    run timeout 200 $P -n 8 tests/test_gpu_fa4.py -k "per_query or additive or eager_codes"
    run timeout 380 python3 scratch/eager_train.py ;;
d)  # session 25: hand-written padded training under 2048 keys now kept as written (`c`: 4 x 1024 ran 78 ms on the op
    # against default compile's 70); the step at 1024 (now default's graph) and 2048 (on the op), left-padded, then the
    # int8-KV GPU tests with half rows on by default
    run timeout 200 python3 scratch/eager_train.py 2048 left
    run timeout 100 python3 scratch/eager_train.py 1024 left
    run timeout 100 $P -n 8 tests/test_gpu_decode_int8kv.py ;;
b)  # session 24 (issue 16): FA4_INDUCTOR_DECODE_HALF_ROWS=1, the int8-KV kernel skipping the softmax of the tile's
    # rows 8-15 for calls of at most 8 packed rows (sm_90a SASS: loop 459 -> 398 instructions, 218 -> 168 registers at
    # d128; d64 308 -> 246, 125 -> 117). Its GPU tests (bit-equal to the switch off), then b1 / b8 x 32k at d128 and d64,
    # switch off / on, at 2 CTAs a SM (smem 100 KB) and 3 (smem 64 KB, MIN_CTAS=3: the split rule aims at 3)
    run timeout 200 $P -n 8 tests/test_gpu_decode_int8kv.py
    for cfg in "0 100 0" "1 100 0" "0 64 3" "1 64 3"; do set -- $cfg
      echo "+ HALF_ROWS=$1 SMEM_KB=$2 MIN_CTAS=$3" >>$L
      for shape in "1 32768 128" "8 32768 128" "1 32768 64" "8 32768 64"; do set -- $cfg $shape
        FA4_INDUCTOR_DECODE_HALF_ROWS=$1 FA4_INDUCTOR_DECODE_SMEM_KB=$2 FA4_INDUCTOR_DECODE_MIN_CTAS=$3 timeout 100 \
          python3 tests/bench_decode_int8kv.py --b $4 --sk $5 --d $6 2>&1 | grep "^b" >>$L
      done
    done ;;
u)  # session 22 left these: the Llama-1B shape's b8 x 128 / 512 padded rows after the crossover change (run 1:
    # b8 x 512 left-padded 0.77x on the op's SDPA fallback), then its decode rows at 2048 (b1, b8, padded)
    run timeout 280 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((2048, 16),), decode_sizes=(), bert=False, batches=(8,), seqlens=(128, 512), time_budget_s=250): print(t.markdown())"
    run timeout 290 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((2048, 16),), decode_sizes=((2048, 16),), bert=False, batches=(1, 8), seqlens=(2048,), phases=('decode',), time_budget_s=260): print(t.markdown())" ;;
x)  # the Llama-1B shape's decode b1 x 128 step (session 21: 0.95x, unexplained): each backend's kernels by GPU time
    run timeout 300 python3 -c "
import torch
from fa4_inductor.bench import models, sweep
from torch.profiler import profile, ProfilerActivity
model = models.llama('sdpa', 'cuda', torch.bfloat16, **models.llama_shape(2048, 16))
sm = sweep.SweepModel('llama', (), decode=True)
case = sweep.Case('decode', 1, 128, False)
for name, backend in models.BACKENDS.items():
    torch._dynamo.reset()
    step = models.compile_model(sweep.decode_step(model), backend, mode='reduce-overhead')
    print(name, 'ms/step', round(sweep.decode_ms(step, model, sm, case, 16, 'cuda')[0], 3), flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        sweep.decode_ms(step, model, sm, case, 4, 'cuda')
    print(prof.key_averages().table(sort_by='cuda_time_total', row_limit=14), flush=True)
" ;;
v)  # the Llama-1B shape's decode rows at 8192 and b1 x 128 again (session 21: 0.95x once)
    run timeout 560 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((2048, 16),), decode_sizes=((2048, 16),), bert=False, batches=(1, 8), seqlens=(128, 8192), phases=('decode',), time_budget_s=520): print(t.markdown())" ;;
t)  # session 22: the padded sweep rows after the two lowering fixes (512x4's were all kept: a batch symbol per input;
    # 2048x16's b8 x 512 ran 0.77x on the op's SDPA fallback), then eager code's float mask input on SDPA: generate's
    # decode (HF compiles the step) and the static-cache padded prefill, ours against default
    run timeout 200 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((512, 4),), decode_sizes=(), bert=False, batches=(1, 8), seqlens=(512, 2048, 8192), time_budget_s=180): print(t.markdown())"
    run timeout 150 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((2048, 16),), decode_sizes=(), bert=False, batches=(8,), seqlens=(128, 512), time_budget_s=130): print(t.markdown())"
    run timeout 240 python3 -c "
import torch
from fa4_inductor.bench import llama_e2e, models, padded
model = models.llama('eager', 'cuda', torch.bfloat16)
tokens, mask = models.padded_batch(model.config.vocab_size, 4, 2048, (0, 100, 700, 1500), 'cuda', 'left')
for name, backend in models.BACKENDS.items():
    torch._dynamo.reset()
    print('eager code, static-cache padded prefill 4 x 2048 |', name, '|', round(padded.padded_ms(model, backend, tokens, mask, False, static_cache=4096), 2), 'ms', flush=True)
for name, backend in models.BACKENDS.items():
    torch._dynamo.reset()
    first, rate, _ = llama_e2e.generate_times(model, backend, 1024, 64, 4, 'cuda')
    print('eager code, generate b4 x 1024 + 64 |', name, '| first token', round(first, 1), 'ms |', round(rate), 'tokens/s', flush=True)
" ;;
p)  # the padded rows one at a time, printed as they finish (a cut run keeps what it timed)
    run timeout 300 python3 -c "
import torch
from fa4_inductor.bench import models, padded
model = models.llama('sdpa', 'cuda', torch.bfloat16)
tokens, mask = models.padded_batch(model.config.vocab_size, 4, 2048, (0, 100, 700, 1500), 'cuda', 'left')
for kind, m, static in (('left-padded, static cache', mask, 4096), ('left-padded', mask, 0), ('no mask', None, 0)):
    for name, backend in models.BACKENDS.items():
        torch._dynamo.reset()
        print(kind, '|', name, '|', round(padded.padded_ms(model, backend, tokens, m, False, static_cache=static), 2), flush=True)
" ;;
q)  # session 20 left this open: which kernels the static-cache padded prefill (run 3: 1.01x) takes, logged once
    echo "+ the static-cache padded prefill's kernel log" >>$L
    timeout 200 python3 -c "
import logging, torch
from fa4_inductor.bench import models, padded
logging.basicConfig(format='%(name)s %(message)s')
logging.getLogger('fa4_inductor.kernels').setLevel(logging.DEBUG)
model = models.llama('sdpa', 'cuda', torch.bfloat16)
tokens, mask = models.padded_batch(model.config.vocab_size, 4, 2048, (0, 100, 700, 1500), 'cuda', 'left')
kwargs = padded.static_cache_prefill(model, tokens, mask, 4096)
compiled = models.compile_model(model, 'fa4_inductor')
with torch.no_grad():
    compiled(tokens, **kwargs, logits_to_keep=1)
" 2>&1 | sort | uniq -c | sort -rn | head -20 >> $L ;;
2)  # issue 15: M = 1 times by prefetch window (session 15 run 4, none: 8192 x 8192 15.0 us); int8 x int8 rows with the
    # in-graph cast and scaling (session 19 run 1, the op: 10.5-23.2 us)
    run timeout 200 python3 tests/bench_w4a16.py --m 1 --gemv int --prefetch 0,4,8 \
        --shapes 8192x8192,2048x8192,8192x2048,4096x14336
    run timeout 150 python3 -m fa4_inductor bench --suite quant --quant-models llama-1b --quant-formats int8_int8 --quant-rows 1,16 --quant-no-e2e --quant-no-prefill ;;
3)  # issue 12: the tiny Llama's decode rows without CUDA graphs, small_decode on (session 18 run 4: one row, 0.90x,
    # on a slow machine; CPU: identical output code); if the prefetch window won in part 2, the NVFP4 decode end to end
    # with it (PF=<window>; session 15 run 5 without: 1.050 ms/token)
    run timeout 200 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False, seqlens=(128, 2048), decode_mode='default', time_budget_s=170): print(t.markdown())"
    [ -n "$PF" ] && run timeout 200 env FA4_INDUCTOR_INT_GEMV_PREFETCH=$PF python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-prefill --quant-e2e-runs nvfp4:plain --quant-prompt 4096 ;;
4)  # issue 12: the Llama-1B shape's whole sweep (~500 s)
    MODELS=2048x16 bash scratch/sweep_all.sh ;;
*)  # issue 12: the rest of the size sweep, one model a call (MODELS=bert, then 512x4, 1024x2, 2048x4, 256x16), or all
    # at once on a machine with several GPUs
    MODELS=${MODELS:-bert} bash scratch/sweep_all.sh ;;
esac
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice\|^USDT\|Failed to load" $L | cut -c1-600 | tail -c 11000
