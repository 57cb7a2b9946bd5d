#!/usr/bin/env bash
# GPU calls that verify and measure what CPU sessions built: tests, measure, diagnose and ddp on
# a two-GPU machine (nvidia-h200-x2), each keeping both GPUs busy; check, verify, next and
# timings on one GPU (nvidia-h200). The device tool allows 10 minutes per command, so the work
# comes in parts, one per call:
#   tests    GPU 0: tests/export (CUDA .pt2 stages in subprocesses), tests/model, tests/integrations
#            GPU 1: tests/cartesian, tests/data, tests/simulation, tests/test_*.py
#            then both: tests/training (NCCL)
#   measure  GPU 0: tensor-product kernel timings (fused / split / grouped / composed double
#                   backward), linear-map tile shapes, kernel profile of both published models, profiler s/run
#            GPU 1: MD vs profiler (old dynamic and captured graph engine steps), export benchmark
#   diagnose GPU 0: which Triton op breaks when inductor inlines it (benchmarks/diagnose_inline.py)
#            GPU 1: tests/export (the CUDA .pt2 packages inline the kernels)
#   check    one GPU: diagnose beside the GPU tests of model, integrations, export, Triton parity
#   verify   one GPU: the inlined-launch fix (model cases, compiled == eager, CUDA .pt2), then opaque vs inlined timings
#   next     one GPU: the CUDA .pt2 tests alone (for their tracebacks), an eager call's host profile, MD dynamic vs graph step
#   diag     one GPU: the CUDA .pt2 load crash, an engine evaluation's profile, the graph step on water
#   final    one GPU: the .pt2 crash's native backtrace, the graph step (water with a 1 Å skin, diamond)
#   aoti     one GPU: the .pt2 crash, Triton-kernel package against the inductor-kernel one; export benchmark
#   timings  one GPU: profiler eager and reduce-overhead for both published models, the Triton .pt2 refusal
#   recheck  one GPU: GPU tests of integrations, model and export after the 2026-12-01 afternoon defaults
#   last     one GPU: MD with the rebuild captured with the step; the Triton .pt2 test with CXX=/usr/bin/g++
#   prebound one GPU: pre-bound Triton launches (GPU test, eager profiler without/with), OpenMM Reference platform MD
#   pt2      one GPU: the Triton-kernel .pt2 GPU test, then the export benchmark on water
#   step     one GPU, alone: MD with the static step's own work and the device rebuilds compiled
#            (compile_step on/off; OpenMM on its Reference and CUDA platforms), water and diamond
#   verify2  one GPU: GPU tests after compile_step and the launcher fix (simulation, the graph-step
#            integrations, pre-bound launches), then the eager profiler without/with pre-bound launches
#   export   one GPU: the pre-bound launch test (float64, 1e-12), then the Triton-kernel .pt2 of
#            i2c3f20l2r on water against the Predictor, with the rest of the call's time
#   pt2energy one GPU: where the Triton-kernel .pt2 loses its energy (stage by stage, offsets as
#            they are and zero; two package compiles), then that GPU test again
#   morning  one GPU, the next session's first call: the Triton .pt2 energy diagnosis, the GPU test
#            the night's time limits cut off, and the kernel profile of both models' training step
#   omm      one GPU, alone: MD on water with OpenMM on its CUDA and Reference platforms and two
#            headrooms; then the pre-bound launches (GPU test, eager profiler without/with)
#   devlist  one GPU: device rebuilds of the graph step's list (tests, MD); the Triton .pt2 built with the system g++
#   evening  one GPU: the .pt2 energy diagnosis again (the morning's stopped at torch 2.11's missing
#            inductor option), and the training-step kernel profiles with more time
#   pt2dump  one GPU: the Triton .pt2's generated sources and inductor's log; weight-gradient split rules
#   final2   one GPU: the CUDA .pt2 tests after the energy fix, Triton parity (weight-gradient
#            splits), the training-step kernel profile with the new split rule
#   pt2check one GPU, the next session's first call: the Triton .pt2 test after the energy fix (dense
#            and binned neighbour search), CUDA TorchScript with both searches, the weight-gradient
#            split tests (about 9 minutes)
#   pt2cells one GPU: the CUDA packages with the binned search and the Triton one with all pairs, in
#            parallel, beside i2c3f20l2r's training-step kernel profiles (eager, then compiled)
#   csrtime  one GPU: compiled kernel profile after the CSR change, then the Triton .pt2 on water (both searches)
#   modelgpu one GPU: tests/model's GPU tests (after the CSR change)
#   pt2time  one GPU: the Triton .pt2 on water with each neighbour search, next to the Predictor
#   trainprofile one GPU: both models' training-step kernel profiles (with the new weight-gradient split)
#   fixed    one GPU: the fixed-capacity CUDA package in CUDA graphs (GPU test), then its Triton .pt2 on water
#   fixeddiamond one GPU: the Triton .pt2 on the 1000-atom diamond, fixed capacity and sized by the structure
#   fixed2   one GPU: the fixed-capacity Triton .pt2 on the diamond, then the GPU test after the capture change
#   trainprofile2 one GPU: the compiled training step's kernel profile after the CSR change
#   fixedprofile one GPU: both fixed-capacity package GPU tests (packages kept), the compiled training
#            step's kernel profile beside them; then where a failing package fails (diagnose_fixed.py)
#   edgeblocks one GPU: where the fixed package fails (streams, loader; diagnose_fixed.py exports it) beside
#            the tensor-product GPU parity tests; then the kernel timings for each BLOCK_E and the eager A/B
#            (kernels.py's --edge-blocks and the edge-blocked walks were removed after this call: slower at
#            every block size, benchmarks/RESULTS.md 2026-12-02 morning)
#   final3   one GPU: the fixed-capacity package GPU test (single-threaded runner under the graphs), then the
#            eager profiler with plain and pre-bound Triton launches, alternating (two processes each)
#   nextcall one GPU, the next session's first call: issue 12's last measurements (the TorchScript file on
#            water and the diamond, the package sized by its structure on the diamond, each next to the
#            Predictor; about 8 minutes)
#   fixedtime one GPU: the fixed-capacity Triton .pt2 on the diamond through load_exported's CUDA graph again,
#            now through the single-threaded runner (the 1.20x of 2026-12-02 used the default one)
#   eagerab  one GPU: the eager A/B in one process with the profiler's loop shape and the profiler's timer in
#            the same process, then the profiler itself in processes of its own
#   fixed64  one GPU: the fixed-capacity GPU test's float64 parameter (inductor's kernels) after the
#            single-threaded runner change (about 6 minutes)
#   stepgrads one GPU: the compiled training step with the parameter gradients by the outer backward against
#            inside the graph (compiled_step_grads.py; two compiles of i2c3f20l2r's step, about 8 minutes)
#   gemms    one GPU: the compiled training step's matrix products by operand shapes (which product is the
#            align1 SIMT sgemm), beside the eager step's (about 6 minutes)
#   prebounddefault one GPU: the eager profiler with pre-bound launches on by default against FLASHCART_PREBOUND_LAUNCH=0,
#            alternating, three processes each; then the launcher's and tests/model's GPU tests with the new default
#   tsdense  one GPU: the PyTorch backend's dense contractions on CUDA (the TorchScript GPU tests, the backend's parity
#            tests on the GPU), then the TorchScript file on water and diamond next to the Predictor (about 7 minutes)
#   linsplit one GPU: the linear maps' forward / input-gradient reduction split (ops.RowMapSplit; GPU parity, float64
#            1e-12), then linear_tiles.py --split and the tf32x3 tiles for both published models, and the radial MLP
#            per pair against per edge (radial_pairs.py; about 8 minutes)
#   pairs    one GPU: the radial MLPs once per pair of reverse edges (FlashCartPotential.radial_pairs): tests/model's
#            GPU tests (compiled, grouped by pairs, == eager, not grouped), the MLP alone, then whole reduce-overhead
#            force calls per edge against per pair, alternating (about 7 minutes)
#   csrbwd   one GPU: the convolution backward in one pass per sender (tp_bwd_csr): GPU parity against the two kernels
#            and the PyTorch backend (float64), kernels.py's backward both ways (F 20, 64; output rank 3), then
#            i2c3f20l2r's eager kernel profile (force call and training step) with FLASHCART_FUSED_CSR_BACKWARD 1 and 0
#   csrcheck one GPU: tests/model's GPU tests (Triton model against the PyTorch backend, training gradients, compiled
#            == eager) and the convolution parity tests, with the one-pass backward (about 4 minutes)
#   afterbwd one GPU, the next session's first call: the profiler (reduce-overhead force call and training step, eager
#            force call) after the one-pass backward, the plain 32x32x16 linear tile against the default and 3xTF32,
#            the compiled training step's kernel profile (about 10 minutes)
#   wrows    one GPU: the products reading the pair rows through the pair index: GPU parity, the MLP table, the
#            reduce-overhead force call per edge and per pair (about 9 minutes)
#   wrows2   one GPU: the same after the per-row weight gradient became one Triton pass, the two settings' force
#            calls each in a process of its own (about 9 minutes)
#   rowsfinal one GPU: compiled training with the pair rows, the compiled force call's kernels with and without them,
#            the profiler's reduce-overhead force call and training step (about 9 minutes)
#   pairsnext one GPU, the next session's first call: GPU parity of compiled calls that really use the pair rows,
#            the reduce-overhead force call per edge and per pair (about 8 minutes)
#   pairstrain one GPU: the same for the reduce-overhead training step (two compiles, about 9 minutes)
#   pipeab   one GPU (also named final4): the pipelined tensor-product forward (FLASHCART_TP_PIPELINE=1) against the
#            plain one: parity, kernels, reduce-overhead force call per pair (about 9 minutes)
#   final5   one GPU: the pipelined forward's parity tests, the force call with it on and off (inductor caches off),
#            the compiled force call's and training step's kernels with it (about 8 minutes)
#   nextgpu  one GPU, the next session's first call: the pipelined forward's F = 70 parity test, the eager profiler,
#            the compiled training step's kernels, i3c3f64l2's reduce-overhead force call per pair (about 10 minutes)
#   linroute one GPU: the linear maps through cuBLAS against the grouped kernel, GPU tests of the matmul route and
#            the int16 CSR sort, i3c3f64l2's force call with the maps as matrix products, i2c3f20l2r's (about 9 minutes)
#   matmulab one GPU: i3c3f64l2's reduce-overhead force call with FLASHCART_LINEAR_MATMUL=scalar and =0 (about 4 minutes)
#   nextmatmul one GPU, the next session's first call: the matmul route's and the edge pairs' GPU tests, then
#            matmulab's A/B on one machine (about 9 minutes)
#   rowsum   one GPU: the weight-row sums in the kernels against the separate pass: GPU parity, force call A/B (about 7 minutes)
#   rowtrain one GPU: the compiled training step's kernels with the weight-row sums in the kernels and in a pass (about 7 minutes)
#   splits   one GPU: the convolution kernels with each node's edges split over programs: parity, kernels, force call (about 8 minutes)
#   final6   one GPU: split-walk GPU parity, the training step's kernels with the defaults (about 6.5 minutes)
#   nextsplits one GPU, the next session's first call: determinism test, kernels at 64 channels split, force call (about 7 minutes)
#   owner    one GPU: weight-row parity tests, the kernels per pair in each row-sum mode, linear-map tiles (about 8 minutes)
#   trainratio one GPU: determinism test, the compiled training step's parameter gradients outside and inside the graph (about 9 minutes)
#   stepgraph one GPU: the trainer's in-graph compiled step (reduce-overhead) against the eager gradients (about 4 minutes)
#   stepgraphtiny one GPU: the same with the tiny model on ethanol (about 2 minutes)
#   unitab   one GPU: FLASHCART_LINEAR_UNIT on and off: linear GPU parity, the maps, i3c3f64l2's force call (about 8 minutes)
#   unittiles one GPU: linear-map tiles with more outputs per thread, now that the copies are 16 bytes (about 3 minutes)
#   dbwdgroups one GPU: the trainer's step with the double backward's receiver pass per receiver or per output rank (about 9 minutes)
#   profile2 one GPU: both models' compiled force call and in-graph training step, kernel by kernel (about 9 minutes)
#   nextstep one GPU: reduce-overhead force call and in-graph training step in one process (about 7 minutes)
#   verify3  one GPU: the compiled model's and the linear maps' GPU parity after the review commit, then unittiles (about 8 minutes)
#   engineneeds one GPU: compiled backward passes narrowed by the engine: parity, force call and training step (about 8 minutes)
#   ncu      one GPU: hardware counters per kernel (ncu) of the compiled force call and training step (about 9 minutes)
#   ncu2     one GPU: part ncu's training step and i3c3f64l2 force call, products, linear maps and GEMMs only (about 6 minutes)
#   ncu3     one GPU: i2c3f20l2r's force call, each product launch under ncu (about 2 minutes)
#   pathgroups (removed with FLASHCART_BWD_PATH_GROUPS, 2026-12-04: RESULTS.md) one GPU: parity and kernels of path groups
#   prefetch one GPU: the node walks' index prefetch: GPU parity, kernels off/on, force call and training step off/on
#   prefetch2 one GPU: FLASHCART_INDEX_PREFETCH auto against 0: kernels, force call and training step
#   splitsparity one GPU, the next session's first call: GPU parity of the auto walk splits, the split walks and conv-l3 (about 8 minutes)
#   splitsauto one GPU: FLASHCART_TP_SPLITS=auto: the products under ncu, the force call against 1 split (about 5 minutes)
#   splitsautotrain one GPU: the trainer's step with FLASHCART_TP_SPLITS 1 and auto (about 9 minutes)
#   rmsforms one GPU: the RMS norm's invariants in its kernel: GPU parity, tests/model, the eager force call A/B (about 6 minutes)
#   eagersync one GPU: the eager force call's synchronisations and its host cProfile (about 3 minutes)
#   eagernext one GPU: the eager force call without Triton launches, reduce-overhead force call and training step (about 8 minutes)
#   edges    one GPU: the fused edge-feature kernels (FLASHCART_FUSED_EDGES): GPU parity, the eager force call A/B in one process
#            and by the profiler, the compiled call's geometry kernel (about 8 minutes)
#   rowwise  one GPU: the fused RMS-norm and gate kernels: GPU parity, tests/model, the eager force call A/B (about 9 minutes)
#   eagercache one GPU: the eager force call with and without the frozen-parameter cache, the eager profiler, tests/model
#   edgesdefault one GPU: with the fused edge features on by default: their GPU parity, tests/model's and the integrations'
#            GPU tests (the physics battery through the eager Triton path), the eager force call A/B (about 8 minutes)
#   prefetchtrain one GPU: the trainer's reduce-overhead step with FLASHCART_INDEX_PREFETCH 0 and auto, a process each
#            (the A/B that part prefetch2 did not reach; about 8 minutes)
#   radialtable one GPU: the radial MLPs tabulated for inference (FlashCartPotential.set_radial_tables): the GPU test
#            (tables against MLPs, compiled against eager), then the profiler's reduce-overhead force call with
#            profile_radial_table 0 and 4096, and the compiled call's kernels with tables (about 9 minutes)
#   radialquick one GPU: part radialtable cut to about 4 minutes (the GPU test, one profiler run with tables, one without)
#   layout   one GPU: the neighbour list's layout (CSR, radial pairs) computed once per list by the Predictor
#            (flashcart.nn.edge_layout): the reduce-overhead force call with FLASHCART_EDGE_LAYOUT 1 and 0 in one
#            process (benchmarks/edge_layout.py, 4096-interval radial tables), then the tests/model GPU tests that the
#            first run (the pairs' GPU tests, 5 passed) did not reach (about 10 minutes)
#   layout2  one GPU: the profiler's reduce-overhead force call with tables, FLASHCART_EDGE_LAYOUT 1 and 0 (a process
#            each), and the compiled call's kernels with the tables and the layout (about 8 minutes)
#   layoutwhy one GPU: why part layout's A/B had the layout once per list slower: the A/B in the other order with perf
#            hints and torch.profiler, then the profiler with FLASHCART_EDGE_LAYOUT 1 and 0, a process each (about 9 minutes)
#   layoutfix one GPU: the layout A/B after the fusion barrier on the tables' lengths, with tables and with the MLPs,
#            then the tables' GPU test (about 8 minutes)
#   layoutprofile one GPU: the profiler's reduce-overhead force call after layoutfix, with tables and without (about 4 minutes)
#   layouttrain one GPU: the profiler's reduce-overhead training step with the layout once per list (about 4 minutes)
#   steptrain one GPU: the force call and the trainer's reduce-overhead step in one process, with the layout (about 4 minutes)
#   h200next one GPU (an H200: the README's machine): profiler reduce-overhead with and without tables, the trainer's
#            step beside the force call, the eager force call, all after the layout and the fusion barrier (about 7 minutes)
#   slopes   one GPU: the tables' slopes in the products' backward kernels: GPU parity, then the profiler's reduce-overhead
#            force call with tables, FLASHCART_TABLE_SLOPES 1 and 0 (about 8 minutes)
#   slopesquick part slopes in less device time (SLOPES_TESTS_ONLY=1: the tests alone)
#   slopesnext one GPU (an H200 if one comes): the profiler's force call with tables and slopes and with the MLPs, the
#            trainer's step, the kernel list with tables (about 9 minutes)
#   tablekernel one GPU: the products evaluating the radial tables in their kernels (FLASHCART_TABLE_KERNEL): GPU
#            parity, the profiler's reduce-overhead force call with 4096-interval tables, kernel 1 and 0 (a process each),
#            then the compiled call's kernel list with the table in the kernels (about 9.5 minutes)
#   tablenext one GPU, the next session's first call: GPU parity of the tabulated weights after the op pair was merged
#            (tp_fwd_tabulated with a table's geometry) and of the static lists (FLASHCART_STATIC_LIST=1) in
#            reduce-overhead calls whose lists change (about 8 minutes)
#   staticab one GPU, after tablenext: the profiler's reduce-overhead force call with the table in the kernels,
#            FLASHCART_STATIC_LIST 1, 0, 1, then FLASHCART_FUSED_CSR_BACKWARD=0 (the second convolution's tp_bwd_csr
#            spills 256 bytes with a table; the two-kernel backward does not), a process each (about 7 minutes)
#   geomdump one GPU: the compiled force call's kernel list and the source of its edge-geometry kernel (about 3 minutes)
#   ddp      both: DDP epoch time on 1 and 2 GPUs
# Usage, from the repository root, with .whl carried (carry: [".whl"]; without it nothing imports ase): bash benchmarks/gpu_session.sh OUT PART
# Each GPU writes one log per part into OUT (the device tool returns at most 8 files).
out=${1:-/tmp/out}; part=${2:-tests}; mkdir -p "$out"
ls .whl/*.whl >/dev/null 2>&1 || { echo "no wheels in .whl: name .whl in the run's carry"; exit 2; }
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 FLASHCART_CACHE_DIR=/tmp/fc
python3 -c "from flashcart.cartesian._backend import torch_ops; torch_ops()"
# vesin-torch is not among ../shared/device-wheels: add its wheels to .whl (pip download vesin-torch==0.6.2
# vesin==0.6.2, see the device README) or the GPU neighbour lists fall back to the torch cell list
python3 -c "from flashcart.data.neighbors import vesin_available; print('vesin-torch loads:', vesin_available())"
S="n_interactions=2 correlation=3 n_hidden_feats=20 l_max_hidden_feats=2 path_reduced_product=true"
L="n_interactions=3 correlation=3 n_hidden_feats=64 l_max_hidden_feats=2"
X=tests/export/test_gpu_export.py

gpu_tests() {  # GPU index, then PATHS:SECONDS items (PATHS: space-separated paths or node ids; the call has 10 minutes in all)
  local gpu=$1; shift
  for item in "$@"; do
    d=${item%:*}; t=${item##*:}  # the limit after the last colon (node ids contain "::")
    paths=$d; [ "$d" = top ] && paths=$(ls tests/test_*.py)
    echo "=== $d (limit ${t} s)"
    # whole log (failures with their tracebacks), without the captured debug logging; at the
    # limit pytest gets SIGINT, so it still prints the failures so far (2026-12-01: a plain kill
    # at the limit lost why the CUDA .pt2 tests failed, twice)
    CUDA_VISIBLE_DEVICES=$gpu timeout -s INT -k 30 "$t" python3 -m pytest -q -m gpu $paths -p no:cacheprovider -p no:logging --tb=short -rfE 2>&1
  done
}

ncu_calls() {  # SECONDS KERNEL_FILTER ("": every kernel) "MODEL PHASE"...: each call under ncu (benchmarks/ncu_call.py;
  # compiles side by side, profiles in turn), then the summaries with each product launch listed, and the CSVs
  local t=$1 filter=$2; shift 2
  local ncu_bin metrics
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  metrics=$(python3 benchmarks/ncu_call.py --print-metrics)
  for run in "$@"; do
    set -- $run
    timeout "$t" "$ncu_bin" --profile-from-start off --clock-control none --target-processes application-only \
      --metrics "$metrics" ${filter:+--kernel-name "$filter"} --csv --page raw --log-file "/tmp/ncu_$1_$2.csv" \
      python3 benchmarks/ncu_call.py --model "$1" --phase "$2" --lock /tmp/profile.lock > "$out/call_$1_$2.log" 2>&1 &
  done
  wait
  for f in /tmp/ncu_*.csv; do
    python3 benchmarks/ncu_call.py --summarize "$f" --rows 40 --detail '^tp_' || tail -5 "$f"
  done > "$out/ncu_summary.log" 2>&1
  tar czf "$out/ncu_csv.tgz" -C /tmp $(cd /tmp && ls ncu_*.csv)
}

env_ab() {  # VARIABLE "VALUES" SECONDS [radial_pairs options]: i2c3f20l2r's reduce-overhead calls per pair, a process per value
  local var=$1 values=$2 t=$3; shift 3
  for n in $values; do
    echo "=== $var=$n"
    env "$var=$n" TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout "$t" python3 benchmarks/radial_pairs.py --device cuda \
      --model i2c3f20l2r --structure diamond --calls reduce-overhead --setting pair --rounds 7 --calls-per-round 20 "$@"
  done
}

splits_ab() {  # SECONDS [radial_pairs options]: FLASHCART_TP_SPLITS 1, then auto
  local t=$1; shift
  env_ab FLASHCART_TP_SPLITS "1 auto" "$t" "$@"
}

profile_run() {  # MODEL (S or L) MODE (eager or a compile mode) PHASE SECONDS [KEY=VALUE ...]: the profiler on the diamond cell
  eval "opts=\$$1"
  extra="profile_phase=$3 profile_row_limit=1"
  [ "$2" = eager ] || extra="$extra profile_compile_predict=true profile_compile_mode=$2"
  echo "=== profiler $1 $2 (FLASHCART_INLINE_TRITON_OPS=${FLASHCART_INLINE_TRITON_OPS:-default}) ${*:5}"
  local t=$4; shift 4
  timeout "$t" bash benchmarks/profile_diamond.sh $opts $extra "$@" 2>&1 | grep -E "^\[|parameters|s/run|Error"
}

matmul_ab() {  # SECONDS per process: i3c3f64l2's reduce-overhead force call with FLASHCART_LINEAR_MATMUL=scalar, then =0
  for mode in scalar 0; do
    FLASHCART_LINEAR_MATMUL=$mode timeout "$1" python3 benchmarks/radial_pairs.py --device cuda --model i3c3f64l2 --structure diamond \
      --calls reduce-overhead --setting pair --rounds 7 --calls-per-round 20 > "$out/calls_large_$mode.log" 2>&1
  done
}

geomdump() {  # SECONDS: the compiled i2c3f20l2r force call's kernels with inductor's sources kept; its edge-geometry
  # kernel (triton_per_fused_add_arange_clamp_..._cos_..., 0.097 ms for 158,000 edges, one launch) comes back
  TORCHINDUCTOR_CACHE_DIR=/tmp/ic timeout "$1" python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases inference \
    --compile-mode default --repeat 3 --rows 40 > "$out/profile_small.log" 2>&1
  grep -rl "def triton_per_fused_add_arange_clamp" /tmp/ic | head -2 | while read f; do cp "$f" "$out/geometry_$(basename "$f")"; done
}

md_graph() {  # STRUCTURE SECONDS NOTE [md_vs_profile options]: ASE and OpenMM MD with the graph step, i2c3f20l2r, reduce-overhead
  local st=$1 t=$2 note=$3; shift 3
  echo "=== md $st (graph step, $note)"
  timeout "$t" python3 benchmarks/md_vs_profile.py --structure "$st" --device gpu --r-max 6 --steps 200 --repeat 20 \
    --compile-mode reduce-overhead --step-mode graph --model $S "$@" 2>&1 | grep -viE "warn"
}

case $part in
tests)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  # the slow ones first: CUDA .pt2 compiles (tests/export) and the kernel parity tests (tests/cartesian)
  # (2026-11-30: tests/cartesian took 313 s alone; tests/integrations needs more than 100 s)
  gpu_tests 0 tests/export:240 tests/model:100 tests/integrations:200 > "$out/tests_gpu0.log" 2>&1 &
  gpu_tests 1 tests/cartesian:360 tests/data:40 tests/simulation:40 top:50 > "$out/tests_gpu1.log" 2>&1 &
  wait
  # the two-GPU NCCL test needs both GPUs
  CUDA_VISIBLE_DEVICES=0,1 timeout 60 python3 -m pytest -q -m gpu tests/training -p no:cacheprovider --tb=short \
    > "$out/tests_training.log" 2>&1
  ;;
measure)
  (
    export CUDA_VISIBLE_DEVICES=0
    # within the call's 10 minutes: about 90 + 60 + 2 x 120 + 4 x 45 s at most (kernels.py took 2 x ~40 s)
    timeout 90 python3 benchmarks/kernels.py --features 20 64 128 --backends triton
    for m in i2c3f20l2r i3c3f64l2; do timeout 45 python3 benchmarks/linear_tiles.py --model $m; done  # FLASHCART_LINEAR_TILES shapes
    for m in i2c3f20l2r i3c3f64l2; do timeout 120 python3 benchmarks/kernel_profile.py --device cuda --model $m --repeat 5; done
    for m in S L; do for mode in eager reduce-overhead; do profile_run $m $mode both 45; done; done
  ) > "$out/measure_gpu0.log" 2>&1 &
  (
    export CUDA_VISIBLE_DEVICES=1
    for st in water diamond; do
      echo "=== md $st reduce-overhead: old (dynamic) and captured (graph) engine steps, OpenMM also spinning"
      timeout 150 python3 benchmarks/md_vs_profile.py --structure $st --device gpu --r-max 6 --steps 200 --repeat 20 \
        --compile-mode reduce-overhead --step-mode dynamic graph --openmm-spin --model $S 2>&1 | grep -viE "warn"
    done
    echo "=== export"
    timeout 250 python3 benchmarks/export.py --device cuda --structures water diamond --r-max 6 --repeat 50 --model $S
  ) > "$out/measure_gpu1.log" 2>&1 &
  wait
  ;;
diagnose)
  # which Triton op breaks when inductor inlines its kernels (GPU 0), beside the export tests (GPU 1)
  CUDA_VISIBLE_DEVICES=0 timeout 540 python3 benchmarks/diagnose_inline.py --out "$out/diag" > "$out/diagnose.log" 2>&1 &
  gpu_tests 1 tests/export:540 > "$out/tests_export.log" 2>&1 &
  wait
  ;;
check)
  # one GPU (nvidia-h200): the diagnosis beside the GPU tests, three streams sharing the card
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  timeout 540 python3 benchmarks/diagnose_inline.py --timeout 200 --out "$out/diag" > "$out/diagnose.log" 2>&1 &
  gpu_tests 0 tests/model:150 tests/integrations:330 > "$out/tests_a.log" 2>&1 &
  gpu_tests 0 tests/export:250 "tests/cartesian/test_triton_parity.py:200" tests/simulation:40 top:50 > "$out/tests_b.log" 2>&1 &
  wait
  tar czf "$out/diag.tgz" -C "$out" diag && rm -rf "$out/diag"  # the tool returns at most 8 files
  ;;
verify)
  # one GPU, after the launch-table fix: the model cases of diagnose_inline and compiled == eager with
  # inlined kernels beside the CUDA .pt2 tests; then timings one at a time (opaque against inlined ops)
  (
    for c in model_forces model_forces_reduce_overhead; do
      echo "=== $c (inlined)"
      FLASHCART_INLINE_TRITON_OPS=1 CUDA_LAUNCH_BLOCKING=1 timeout 150 python3 -X faulthandler benchmarks/diagnose_inline.py --case $c 2>&1 | grep -v DEBUG | tail -4
    done
    FLASHCART_INLINE_TRITON_OPS=1 gpu_tests 0 tests/model:150
  ) > "$out/inline.log" 2>&1 &
  gpu_tests 0 tests/export:300 > "$out/tests_export.log" 2>&1 &
  wait
  (
    FLASHCART_INLINE_TRITON_OPS=1 profile_run S reduce-overhead both 50; FLASHCART_INLINE_TRITON_OPS=0 profile_run S reduce-overhead both 50
    for m in i3c3f64l2 i2c3f20l2r; do timeout 45 python3 benchmarks/linear_tiles.py --model $m; done
    FLASHCART_INLINE_TRITON_OPS=1 profile_run L reduce-overhead both 50; FLASHCART_INLINE_TRITON_OPS=0 profile_run L reduce-overhead both 50
    FLASHCART_INLINE_TRITON_OPS=1 profile_run S default both 50; FLASHCART_INLINE_TRITON_OPS=0 profile_run S default both 50
  ) > "$out/timings.log" 2>&1
  ;;
next)
  # one GPU, the next session's first call: why the CUDA .pt2 tests fail (they compile for
  # minutes: alone, with the whole call's time), then the graph step with the padding spread
  gpu_tests 0 tests/export/test_gpu_export.py:300 > "$out/tests_export.log" 2>&1
  # where an eager force call's host time goes (Triton's launcher, FlashCart's Python, ATen)
  timeout 60 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases inference --repeat 3 \
    --host-profile 10 --rows 40 > "$out/host_profile.log" 2>&1
  for st in water diamond; do
    echo "=== md $st"
    timeout 100 python3 benchmarks/md_vs_profile.py --structure $st --device gpu --r-max 6 --steps 200 --repeat 20 \
      --compile-mode reduce-overhead --step-mode dynamic graph --model $S 2>&1 | grep -viE "warn"
  done > "$out/md.log" 2>&1
  ;;
diag)
  # one GPU: why the CUDA .pt2 with Triton kernels crashes at load (package contents, loads in
  # fresh processes, gdb backtrace), where an engine evaluation goes, the graph step on water
  timeout 220 python3 benchmarks/diagnose_aoti.py --out /tmp/aoti > "$out/aoti.log" 2>&1
  timeout 80 python3 benchmarks/engine_profile.py --structure water --compile-mode reduce-overhead --rows 30 > "$out/engine.log" 2>&1
  timeout 170 python3 benchmarks/md_vs_profile.py --structure water --device gpu --r-max 6 --steps 200 --repeat 20 \
    --compile-mode reduce-overhead --step-mode graph --openmm-spin --model $S 2>&1 | grep -viE "warn" > "$out/md_graph.log" 2>&1
  ;;
final)
  # one GPU, after diag: the .pt2 load crash's native backtrace; the graph step on water with a
  # 1 Å skin (ASE, and OpenMM on its CPU platform with the model on the GPU) and on diamond
  timeout 240 python3 benchmarks/diagnose_aoti.py --out /tmp/aoti > "$out/aoti.log" 2>&1
  timeout 150 python3 benchmarks/md_vs_profile.py --structure water --device gpu --r-max 6 --steps 200 --repeat 20 --skin 1.0 \
    --compile-mode reduce-overhead --step-mode graph --openmm-platform CPU --model $S 2>&1 | grep -viE "warn" > "$out/md_water_skin1.log" 2>&1
  timeout 140 python3 benchmarks/md_vs_profile.py --structure diamond --device gpu --r-max 6 --steps 200 --repeat 20 \
    --compile-mode reduce-overhead --step-mode graph --model $S 2>&1 | grep -viE "warn" > "$out/md_diamond_graph.log" 2>&1
  ;;
aoti)
  # one GPU: the .pt2 load crash. The Triton-kernel package built three ways (without AOTInductor's
  # precompiled header, linked with -lstdc++, wrapper at -O2) and the inductor-kernel package
  # (which loads), all compiled at once, with their compiler command lines; then the export
  # benchmark (issue 12), which prints each row as it is measured
  timeout 270 python3 benchmarks/diagnose_aoti.py --out /tmp/aoti --no-triton-too --export-timeout 200 --configs \
    "{'aot_inductor.precompile_headers': False}" "{'aot_inductor.custom_op_libs': ['stdc++']}" \
    "{'aot_inductor.compile_wrapper_opt_level': 'O2'}" > "$out/aoti.log" 2>&1
  timeout 290 python3 benchmarks/export.py --device cuda --structures water --formats aoti --r-max 6 --repeat 50 --model $S \
    > "$out/export.log" 2>&1
  ;;
timings)
  # one GPU, after aoti: the profiler at both modes with the ops inlined (the default since
  # 2026-12-01), one at a time (about 315 s), then the CUDA package with the Triton kernels: the
  # export must refuse it while torch's loader crashes on it (or, once it loads, match)
  # i2c3f20l2r's reduce-overhead run includes the training step: the first compiled training on
  # the GPU with the fused double-backward kernels inlined
  (profile_run S eager inference 60; profile_run S reduce-overhead both 120
   profile_run L eager inference 60; profile_run L reduce-overhead inference 75) > "$out/profiler.log" 2>&1
  gpu_tests 0 "$X::test_cuda_package_matches_predictor[dtype2-1e-05-True]:200" > "$out/tests_export_triton.log" 2>&1
  ;;
recheck)
  # one GPU: the GPU tests that the 2026-12-01 afternoon changes touch (step "auto" captures the
  # graph step with reduce-overhead; CUDA packages of inductor's kernels by default)
  gpu_tests 0 tests/integrations:290 tests/model:80 \
    "$X::test_cuda_package_matches_predictor[dtype0-1e-10-False] $X::test_cuda_torchscript_matches_predictor $X::test_cuda_graph_uses_the_triton_kernels:190" \
    > "$out/tests_recheck.log" 2>&1
  ;;
devlist)
  # one GPU, 2026-12-01 evening: the device rebuilds of the graph step's list (GPU tests first,
  # then MD on water and diamond), and in the background the Triton .pt2 compiled with the
  # system g++ instead of the /opt/gcc g++ that inductor picked (whose wrapper.so links no
  # libstdc++.so and defines libstdc++ symbols of its own: the load crash is in std::regex)
  (
    echo "CXX=${CXX:-unset} PATH=$PATH"; echo "which g++: $(which g++)"; ls -la /opt/gcc/bin/g++ 2>&1
    /opt/gcc/bin/g++ --version 2>&1 | head -1; /opt/gcc/bin/g++ -v 2>&1 | tail -2 | cut -c1-600
    for f in libstdc++.so libstdc++.a; do echo "$f: $(/opt/gcc/bin/g++ -print-file-name=$f) | system: $(/usr/bin/g++ -print-file-name=$f)"; done
    python3 -c "import torch._inductor.config as c; print('inductor cpp.cxx', c.cpp.cxx)"
    CXX=/usr/bin/g++ timeout 330 python3 benchmarks/diagnose_aoti.py --out /tmp/aoti --no-triton-too --export-timeout 250 --configs "{}"
  ) > "$out/aoti.log" 2>&1 &
  gpu_tests 0 "tests/simulation/test_static_list.py tests/integrations/test_gpu.py::test_graph_step_equals_the_eager_engine_along_md_with_rebuilds tests/integrations/test_gpu.py::test_graph_is_captured_again_only_when_a_capacity_grows tests/integrations/test_gpu.py::test_battery_through_the_static_and_captured_steps:170" \
    > "$out/tests_devlist.log" 2>&1
  (md_graph water 150 "device rebuilds"; md_graph diamond 150 "device rebuilds") > "$out/md_devlist.log" 2>&1
  wait
  ;;
last)
  # one GPU, the session's last 5 minutes: MD with the device rebuild captured with the step (not
  # at the first rebuild, inside the timed steps), and, beside it, the Triton .pt2 GPU test
  # compiled with the system g++ (its C++ wrapper then links libstdc++.so and loads)
  CXX=/usr/bin/g++ gpu_tests 0 "$X::test_cuda_package_matches_predictor[dtype2-1e-05-True]:230" > "$out/tests_triton_pt2.log" 2>&1 &
  (md_graph water 135 "rebuild captured with the step"; md_graph diamond 135 "rebuild captured with the step") > "$out/md_last.log" 2>&1
  wait
  ;;
prenormforms)
  # FLASHCART_NORM_FORMS: the RMS norm's invariants as quadratic forms in inductor's kernels in compiled calls, instead of
  # a symmetric product launch each way (4 norms in i2c3f20l2r: 8 product launches). GPU test, then graph_bound A/B/A
  # (tables, unpadded as the profiler), then the kernel list with the forms
  gpu_tests 0 "tests/model/test_gpu_model.py::test_norm_forms_in_compiled_calls_on_gpu:200" > "$out/tests.log" 2>&1
  for v in 1 0 1; do
    FLASHCART_NORM_FORMS=$v timeout 120 python3 benchmarks/graph_bound.py --device cuda --model i2c3f20l2r --radial-table 4096
  done > "$out/bound_forms.log" 2>&1
  FLASHCART_NORM_FORMS=1 timeout 120 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases inference \
    --compile-mode default --repeat 5 --rows 80 --radial-table 4096 > "$out/kernels_forms.log" 2>&1
  ;;
hostgpu)
  # the [host-gpu] measurement's GPU test alone (no kernels to compile: fits a short budget)
  gpu_tests 0 "tests/test_profiler.py::test_host_gpu_split_on_cuda:90" > "$out/tests.log" 2>&1
  ;;
bound)
  # is the reduce-overhead force call bound by the GPU or the host? (benchmarks/graph_bound.py: pipelined, host issue,
  # serial and GPU-only times per call; the host's busiest functions): i2c3f20l2r with tables, unpadded as the profiler
  # runs it, then padded (as the engine runs it) with and without static lists (FLASHCART_STATIC_LIST applies to padded
  # Predictors only: afternoon1's profiler A/B ran unpadded), then with the MLPs
  gpu_tests 0 "tests/test_profiler.py::test_host_gpu_split_on_cuda:60" > "$out/tests.log" 2>&1
  timeout 230 python3 benchmarks/graph_bound.py --device cuda --model i2c3f20l2r --radial-table 4096 --cprofile 20 > "$out/bound_S_table.log" 2>&1
  for v in 1 0; do
    FLASHCART_STATIC_LIST=$v timeout 90 python3 benchmarks/graph_bound.py --device cuda --model i2c3f20l2r --radial-table 4096 --pad \
      > "$out/bound_S_table_pad_static$v.log" 2>&1
  done
  [ -n "$BOUND_MLP" ] && timeout 100 python3 benchmarks/graph_bound.py --device cuda --model i2c3f20l2r > "$out/bound_S_mlp.log" 2>&1
  ;;
eveningtests)
  # the model's GPU tests afternoon1's limit cut off (its table tests took the call's time compiling): the tables in the
  # model, compiled and eager, and the static lists in reduce-overhead calls
  gpu_tests 0 "tests/model/test_gpu_model.py::test_static_lists_in_reduce_overhead_calls tests/model/test_gpu_model.py::test_radial_tables_on_gpu_compiled_and_eager:560" \
    > "$out/tests.log" 2>&1
  ;;
slopesquick)
  # part slopes in less device time: the model's GPU test with tables (slopes against autograd, compiled and eager), the
  # expansion's parity and the slope kernels' parity at 20 channels, then the A/B (about 6 minutes)
  CUDA_VISIBLE_DEVICES=0 timeout -s INT -k 20 200 python3 -m pytest -q -m gpu -p no:cacheprovider -p no:logging --tb=short -rfE \
    tests/model/test_gpu_model.py::test_radial_tables_on_gpu_compiled_and_eager tests/cartesian/test_triton_parity.py::test_expansion_parity \
    tests/cartesian/test_weight_slopes.py -k "radial_tables or expansion or (20 and (per or rows)) or unlisted" > "$out/tests.log" 2>&1
  [ "${SLOPES_TESTS_ONLY:-0}" = 1 ] && exit 0
  for v in 1 0; do
    echo "FLASHCART_TABLE_SLOPES=$v"; (export FLASHCART_TABLE_SLOPES=$v; profile_run S reduce-overhead inference 110 profile_radial_table=4096)
  done > "$out/profile_slopes.log" 2>&1
  ;;
*)
  echo "unknown part $part (tests, measure, diagnose, check, verify, next, diag, final, aoti, timings, recheck, devlist, last, prebound, pt2, omm, step, verify2, export, pt2energy, morning, evening, pt2dump, final2, pt2check, pt2cells, csrtime, modelgpu, pt2time, trainprofile, fixed, fixeddiamond, fixed2, trainprofile2, fixedprofile, edgeblocks, final3, nextcall, fixedtime, eagerab, fixed64, stepgrads, gemms, prebounddefault, tsdense, linsplit, pairs, csrbwd, csrcheck, afterbwd, wrows, wrows2, rowsfinal, pairsnext, pairstrain, final4, pipeab, final5, nextgpu, linroute, matmulab, nextmatmul, rowsum, rowtrain, splits, final6, nextsplits, owner, trainratio, stepgraph, stepgraphtiny, nextstep, profile2, unitab, unittiles, dbwdgroups, verify3, engineneeds, ncu, ncu2, ncu3, pathgroups, splitsauto, splitsautotrain, splitsparity, prefetch, prefetch2, geomdump, eagercache, rowwise, eagernext, eagersync, rmsforms, edges or ddp)"; exit 2
  ;;
esac
for f in "$out"/*.log; do echo "##### $f"; tail -40 "$f"; done
