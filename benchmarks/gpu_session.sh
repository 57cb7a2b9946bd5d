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
#   liststests one GPU, the next session's first call: compiled settings' and static lists' (engine) GPU tests, the profiler A/B
#   abtests  one GPU: part ab with --barrier (9 rounds), then part defaults' test groups side by side (about 9 minutes)
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
#   short    one GPU: part one in about 7 minutes (static lists 0/1 unpadded, their GPU test, then the forms on;
#            SHORT_NO_FORMS=1 SHORT_TEST_S=80: about 5.5 minutes)
#   one      one GPU: night1 and night2 cut to one call: graph_bound unpadded (forms 0 static 0 with a cProfile, static 1,
#            forms 1), the GPU tests of static lists and forms, the host/GPU split's GPU test (about 9.5 minutes)
#   night1   one GPU: the host/GPU split's GPU test; graph_bound.py with tables, FLASHCART_NORM_FORMS 0 (with the host's
#            cProfile) and 1; padded with FLASHCART_STATIC_LIST=1 (about 8 minutes)
#   night2   one GPU, after night1: the norm forms' GPU test, their A/B tail (0, 1), padded without static lists, the
#            kernel list with the forms, the calls without dynamo's guards (about 9 minutes)
#   static   one GPU: FLASHCART_STATIC_SHAPES 0/1 on the published convolution's kernels (kernels.py), with it the walks
#            split 2 and 4 ways, then its GPU parity (about 9 minutes; STATIC_SHORT=1 skips the splits: about 7)
#   static2  one GPU: the profiler's call without and with static shapes, the model's GPU tests with them, the training step's kernels
#   static3  one GPU, after static: graph_bound without and with static shapes (4 splits), their model and table GPU tests
#   defaults one GPU, next: the model's table, static-list and opt-in settings' GPU tests, the tables' and the linear pairs'
#   training one GPU: the training step's kernels of both published models under the new defaults, the double
#            backward's layouts with static shapes
#   dbwdnext one GPU: i3c3f64l2's training step, the one-launch double backward (default) against the sender pass,
#            beside the conv-l3 parity case, the Triton .pt2 tests and the compiled settings' test (about 9 minutes)
#   defaultsnow one GPU: the force call with static lists and combined kernels (the defaults since 2026-12-07 late
#            night) against both off, then the profiler's reduce-overhead call with tables (about 5 minutes)
#   ab       one GPU: graph_bound under nine settings compiled side by side (sender walk, norm forms, static lists, combo
#            kernels, linear pairs, tables of 1024 and 2048 intervals)
#   walk     one GPU: graph_bound with static lists 0/1 and the first convolution's backward as the sender walk
#            (FLASHCART_SENDER_WALK_BACKWARD), then its GPU parity (about 9.5 minutes; WALK_PROFILE=1 adds the profiler first)
#   walktests one GPU: the static lists' GPU test, the model's table test with the sender walk, its kernel list
#   h200night one GPU, an H200: the profiler's reduce-overhead force call with tables, then night1's graph_bound runs
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

table_ab() {  # SECONDS "VAR=VALUE ..."...: the profiler's reduce-overhead force call of i2c3f20l2r with 4096-interval
  # tables under each setting of environment variables, a process each, the setting printed first
  local t=$1 setting; shift
  for setting in "$@"; do
    echo "$setting"; (export $setting; profile_run S reduce-overhead inference "$t" profile_radial_table=4096)
  done
}

bound_s() {  # SECONDS LOG [graph_bound.py options]: benchmarks/graph_bound.py on i2c3f20l2r with 4096-interval tables
  # (settings from the caller's environment), its output in $out/LOG
  local t=$1 log=$2; shift 2
  timeout "$t" python3 benchmarks/graph_bound.py --device cuda --model i2c3f20l2r --radial-table 4096 "$@" > "$out/$log" 2>&1
}

bound_ab() {  # SECONDS "LOG VAR=VALUE ..."...: graph_bound.py (i2c3f20l2r, 4096-interval tables, 5 rounds) under each
  # setting, a process each, started together: they compile side by side and time in turns (--lock), so an A/B of
  # four settings costs about one cold compile, not four; output in $out/LOG. BOUND_TABLE=K in a setting: K intervals
  # (--barrier: no process times before all have compiled; rounds interleave, one at a time)
  local t=$1 setting log n; shift; n=$#; rm -f /tmp/bound.lock.ready.*
  for setting in "$@"; do
    set -- $setting; log=$1; shift
    ([ $# -eq 0 ] || export "$@"; timeout "$t" python3 benchmarks/graph_bound.py --device cuda --model i2c3f20l2r --radial-table "${BOUND_TABLE:-4096}" --rounds "${BOUND_ROUNDS:-5}" \
      --lock /tmp/bound.lock --barrier "$n" > "$out/$log" 2>&1) &
  done
  wait
}

dbwd_ab() {  # MODEL BOUND_S [ITEM...]: graph_bound --training of MODEL with the double backward's default (d x1 by
  # atomic adds, one launch) and with FLASHCART_FUSED_DOUBLE_BACKWARD=sender, compiled side by side while each gpu_tests
  # ITEM runs (an optional leading VAR=VALUE sets its environment); every ITEM's end is a barrier marker, so the timed
  # rounds run after the last test
  local model=$1 tb=$2 setting i=0; shift 2
  local n=$(($# + 2))  # barrier markers: two graph_bound processes, each ITEM
  rm -f /tmp/bound.lock.ready.*
  for setting in "ab_dbwd_default_$model.log FLASHCART_FUSED_DOUBLE_BACKWARD=1" "ab_dbwd_sender_$model.log FLASHCART_FUSED_DOUBLE_BACKWARD=sender"; do
    (export "${setting#* }"; timeout "$tb" python3 benchmarks/graph_bound.py --device cuda --model "$model" --rounds 7 --training \
      --lock /tmp/bound.lock --barrier "$n" > "$out/${setting%% *}" 2>&1) &
  done
  for item in "$@"; do
    i=$((i + 1))
    case $item in
      *=*\ *) (export "${item%% *}"; gpu_tests 0 "${item#* }" > "$out/tests_group$i.log" 2>&1; touch /tmp/bound.lock.ready.t$i) & ;;
      *) (gpu_tests 0 "$item" > "$out/tests_group$i.log" 2>&1; touch /tmp/bound.lock.ready.t$i) & ;;
    esac
  done
  wait
}

# parts ab and abtests: the force call's settings of 2026-12-07 (LINEAR_PAIRS=1 became the default after them)
AB_SETTINGS=("ab_defaults.log" "ab_walk.log FLASHCART_SENDER_WALK_BACKWARD=1" "ab_forms.log FLASHCART_NORM_FORMS=1"
  "ab_table1024.log BOUND_TABLE=1024" "ab_table2048.log BOUND_TABLE=2048"
  "ab_lists.log FLASHCART_STATIC_LIST=1" "ab_combo.log FLASHCART_COMBO_KERNELS=1" "ab_pairs.log FLASHCART_LINEAR_PAIRS=1"
  "ab_all.log FLASHCART_SENDER_WALK_BACKWARD=1 FLASHCART_NORM_FORMS=1 FLASHCART_STATIC_LIST=1 FLASHCART_COMBO_KERNELS=1 FLASHCART_LINEAR_PAIRS=1")

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
prebound)
  # one GPU, for the session after 2026-12-01 evening: pre-bound Triton launches (their GPU test,
  # then the eager profiler without and with them), and OpenMM integrating on the CPU (Reference
  # platform: no second CUDA context beside PyTorch's) with the model on the GPU
  gpu_tests 0 "tests/cartesian/test_launcher.py:150" > "$out/tests_launcher.log" 2>&1
  (FLASHCART_PREBOUND_LAUNCH=0 profile_run S eager inference 70; FLASHCART_PREBOUND_LAUNCH=1 profile_run S eager inference 70
   FLASHCART_PREBOUND_LAUNCH=0 profile_run L eager inference 70; FLASHCART_PREBOUND_LAUNCH=1 profile_run L eager inference 70) \
    > "$out/prebound.log" 2>&1
  md_graph water 140 "OpenMM on its Reference platform" --engines openmm --openmm-platform Reference > "$out/md_openmm_reference.log" 2>&1
  ;;
pt2)
  # one GPU: the Triton-kernel .pt2 (compiled with a compiler that links libstdc++.so) against the
  # Predictor, then the export benchmark on water with the whole call's remaining time
  gpu_tests 0 "$X::test_cuda_package_matches_predictor[dtype2-1e-05-True]:330" > "$out/tests_triton_pt2.log" 2>&1
  timeout 260 python3 benchmarks/export.py --device cuda --structures water --formats aoti --r-max 6 --repeat 50 --model $S \
    > "$out/export.log" 2>&1
  ;;
omm)
  # one GPU, 2026-12-01 night: nothing else on the card while MD is timed. OpenMM's CUDA platform
  # (its own CUDA context beside PyTorch's) against its Reference platform (integration on the
  # host: a PythonForce round trip of about 1 us here), each with the engine's default headroom
  # and a smaller one (fewer padding edges in the captured step)
  md_graph water 250 "CUDA and Reference platforms, headroom 0.1 and 0.03" --openmm-platform CUDA Reference --headroom 0.1 0.03 \
    > "$out/md_water.log" 2>&1
  gpu_tests 0 "tests/cartesian/test_launcher.py:100" > "$out/tests_launcher.log" 2>&1
  (FLASHCART_PREBOUND_LAUNCH=0 profile_run S eager inference 60; FLASHCART_PREBOUND_LAUNCH=1 profile_run S eager inference 60) \
    > "$out/prebound.log" 2>&1
  ;;
step)
  # one GPU, 2026-12-01 night, after omm: the pre-bound launch test again (it now says why no
  # launch was pre-bound), then MD alone on the card
  gpu_tests 0 "tests/cartesian/test_launcher.py:60" > "$out/tests_launcher.log" 2>&1
  md_graph water 260 "compile_step on and off; OpenMM Reference and CUDA" --openmm-platform Reference CUDA --compile-step on off \
    > "$out/md_water.log" 2>&1
  md_graph diamond 200 "compile_step on; OpenMM Reference and CUDA" --openmm-platform Reference CUDA --compile-step on \
    > "$out/md_diamond.log" 2>&1
  ;;
verify2)
  I=tests/integrations/test_gpu.py
  gpu_tests 0 "tests/cartesian/test_launcher.py tests/simulation $I::test_graph_step_equals_the_eager_engine_along_md_with_rebuilds $I::test_graph_is_captured_again_only_when_a_capacity_grows $I::test_battery_through_the_static_and_captured_steps $I::test_reduce_overhead_engine_reuses_detects_stale_lists_and_matches_eager:250" \
    > "$out/tests.log" 2>&1
  (FLASHCART_PREBOUND_LAUNCH=0 profile_run S eager inference 60; FLASHCART_PREBOUND_LAUNCH=1 profile_run S eager inference 60) \
    > "$out/prebound.log" 2>&1
  ;;
export)
  gpu_tests 0 "tests/cartesian/test_launcher.py:50" > "$out/tests_launcher.log" 2>&1
  timeout 500 python3 benchmarks/export.py --device cuda --structures water --formats aoti --triton --r-max 6 --repeat 50 --model $S \
    > "$out/export.log" 2>&1
  ;;
pt2energy)
  timeout 400 python3 benchmarks/diagnose_pt2_energy.py --package --zero-offsets > "$out/pt2_energy.log" 2>&1
  gpu_tests 0 "$X::test_cuda_package_matches_predictor[dtype2-1e-05-True-all-pairs]:180" > "$out/tests_triton_pt2.log" 2>&1
  ;;
morning)
  timeout 330 python3 benchmarks/diagnose_pt2_energy.py --package --zero-offsets > "$out/pt2_energy.log" 2>&1
  gpu_tests 0 "tests/integrations/test_gpu.py::test_reduce_overhead_engine_reuses_detects_stale_lists_and_matches_eager:120" > "$out/tests.log" 2>&1
  for m in i2c3f20l2r i3c3f64l2; do timeout 70 python3 benchmarks/kernel_profile.py --device cuda --model $m --phases training --repeat 3; done \
    > "$out/kernel_profile_training.log" 2>&1
  ;;
evening)
  timeout 290 python3 benchmarks/diagnose_pt2_energy.py --package --zero-offsets --skip-compile > "$out/pt2_energy.log" 2>&1
  for m in i2c3f20l2r i3c3f64l2; do timeout 140 python3 benchmarks/kernel_profile.py --device cuda --model $m --phases training --repeat 3; done \
    > "$out/kernel_profile_training.log" 2>&1
  ;;
pt2dump)
  TORCH_LOGS=output_code,post_grad_graphs timeout 200 python3 benchmarks/diagnose_pt2_energy.py --package --skip-compile --dump "$out/pt2src" > "$out/pt2_dump.log" 2>&1
  for m in i2c3f20l2r i3c3f64l2; do timeout 100 python3 benchmarks/linear_tiles.py --model $m --weight-grad 0x64 512x32 1024x16 2048x16 2048x8 4096x8; done \
    > "$out/weight_grad.log" 2>&1
  ;;
final2)
  gpu_tests 0 "tests/export/test_gpu_export.py::test_cuda_package_matches_predictor:330" > "$out/tests_export.log" 2>&1 &
  gpu_tests 0 "tests/cartesian/test_triton_parity.py:90" > "$out/tests_parity.log" 2>&1
  timeout 130 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases training --repeat 3 > "$out/kernel_profile_training.log" 2>&1
  wait
  ;;
pt2check)
  gpu_tests 0 "tests/export/test_gpu_export.py::test_cuda_package_matches_predictor[dtype2-1e-05-True-all-pairs]:200" \
    "tests/export/test_gpu_export.py::test_cuda_package_matches_predictor[dtype3-1e-05-True-cells]:200" \
    "tests/export/test_gpu_export.py::test_cuda_torchscript_matches_predictor:60" \
    "tests/cartesian/test_triton_parity.py::test_weight_gradient_split_rules:60" > "$out/tests.log" 2>&1
  ;;
pt2cells)
  # after the unbacked-slice fix: the CUDA packages with the binned search (inductor kernels, float64;
  # Triton kernels), the Triton package with all pairs (the energy fix), in parallel (compiles take
  # ~200 s or more each); beside them the training-step kernel profile (kernel times, not wall)
  P="$X::test_cuda_package_matches_predictor"
  gpu_tests 0 "$P[dtype1-1e-10-False-cells]:540" > "$out/tests_inductor_cells.log" 2>&1 &
  gpu_tests 0 "$P[dtype3-1e-05-True-all-pairs]:540" > "$out/tests_triton_all_pairs.log" 2>&1 &
  gpu_tests 0 "$P[dtype4-1e-05-True-cells]:540" > "$out/tests_triton_cells.log" 2>&1 &
  timeout 170 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases training --repeat 3 > "$out/kernel_profile_training.log" 2>&1
  # the kernels inductor writes for the compiled force call and training step (what reduce-overhead replays)
  timeout 340 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --compile-mode default --repeat 5 --rows 40 \
    > "$out/kernel_profile_compiled.log" 2>&1
  wait
  ;;
csrtime)
  # the compiled force call's and training step's kernels after the CSR change (binary searches,
  # no sort-based index_put_), then the Triton .pt2 on water with each neighbour search (1.2x target)
  timeout 180 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --compile-mode default --repeat 5 --rows 25 \
    > "$out/kernel_profile_compiled.log" 2>&1
  timeout 360 python3 benchmarks/export.py --device cuda --structures water --formats aoti --triton --r-max 6 --repeat 50 --model $S \
    --neighbours cells all-pairs > "$out/export.log" 2>&1
  ;;
modelgpu)
  # the model's GPU tests (Triton == PyTorch backend, compiled == eager) after the CSR change
  gpu_tests 0 tests/model:130 > "$out/tests_model.log" 2>&1
  ;;
pt2time)
  # the Triton .pt2 with each neighbour search on water, next to the Predictor (the 1.2x target)
  timeout 560 python3 benchmarks/export.py --device cuda --structures water --formats aoti --triton --r-max 6 --repeat 50 --model $S \
    --neighbours cells all-pairs > "$out/export.log" 2>&1
  ;;
trainprofile)
  for m in i2c3f20l2r i3c3f64l2; do timeout 150 python3 benchmarks/kernel_profile.py --device cuda --model $m --phases training --repeat 3; done \
    > "$out/kernel_profile_training.log" 2>&1
  ;;
fixed)
  # the fixed-capacity CUDA package in CUDA graphs (GPU test, Triton kernels), then the fixed-capacity
  # Triton .pt2 on water, raw and through load_exported's CUDA graph, next to the Predictor (the 1.2x target)
  # (in parallel: the test's package compiles for about 5 minutes; its GPU work is a few small calls)
  # AOTI_RUNTIME_CHECK_INPUTS: the package checks its inputs' sizes, dtypes and strides with a clear message
  # (2026-12-02: this test's package failed on its first in-process call with "invalid argument")
  AOTI_RUNTIME_CHECK_INPUTS=1 gpu_tests 0 "$X::test_cuda_fixed_capacity_package_in_cuda_graphs_matches_predictor[dtype0-1e-05-True]:540" \
    > "$out/tests_fixed.log" 2>&1 &
  timeout 540 python3 benchmarks/export.py --device cuda --structures water --formats aoti --triton --r-max 6 --repeat 50 --model $S \
    --neighbours cells --capacity fixed > "$out/export_water.log" 2>&1
  wait
  ;;
fixeddiamond)
  # the 1000-atom diamond: the Triton .pt2, fixed capacity (raw, CUDA graph) and sized by the structure
  timeout 560 python3 benchmarks/export.py --device cuda --structures diamond --formats aoti --triton --r-max 6 --repeat 50 --model $S \
    --neighbours cells --capacity fixed dynamic > "$out/export_diamond.log" 2>&1
  ;;
fixed2)
  # the fixed-capacity Triton .pt2 on the 1000-atom diamond (raw and in a CUDA graph), then the GPU
  # test after the capture change (one run on the caller's stream first), one after the other
  timeout 270 python3 benchmarks/export.py --device cuda --structures diamond --formats aoti --triton --r-max 6 --repeat 50 --model $S \
    --neighbours cells --capacity fixed > "$out/export_diamond.log" 2>&1
  gpu_tests 0 "$X::test_cuda_fixed_capacity_package_in_cuda_graphs_matches_predictor[dtype0-1e-05-True]:280" > "$out/tests_fixed.log" 2>&1
  ;;
unitab)
  # the grouped matmul compiled for its contiguous operand axes (FLASHCART_LINEAR_UNIT): GPU parity (float64, 1e-12),
  # the maps alone (CUDA-graph replays) and i3c3f64l2's reduce-overhead force call, on and off (a process each)
  timeout 150 python3 -m pytest -q -m gpu tests/cartesian/test_triton_parity.py -k linear -p no:cacheprovider --tb=short \
    > "$out/tests_linear.log" 2>&1
  (cd benchmarks && for m in i3c3f64l2 i2c3f20l2r; do
    timeout 90 python3 linear_tiles.py --model $m --tiles default 32x32x32x4x2 64x64x32x4x3 --unit 0 1 1 0
    timeout 60 python3 linear_tiles.py --model $m --weight-grad 2048x8 --unit 0 1 1 0
  done) > "$out/linear_unit.log" 2>&1
  for u in 1 0; do
    echo "=== FLASHCART_LINEAR_UNIT=$u"
    FLASHCART_LINEAR_UNIT=$u TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 130 python3 benchmarks/radial_pairs.py --device cuda \
      --model i3c3f64l2 --structure diamond --calls reduce-overhead --setting pair --rounds 7 --calls-per-round 20
  done > "$out/calls_unit.log" 2>&1
  ;;
trainprofile2)
  # the compiled training step's kernels after the CSR change (its compile alone takes about 3 minutes)
  timeout 560 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases training --compile-mode default --repeat 5 \
    --rows 30 > "$out/kernel_profile_training_compiled.log" 2>&1
  ;;
fixedprofile)
  for v in "dtype0-1e-05-True" "dtype1-1e-10-False"; do
    (CUDA_VISIBLE_DEVICES=0 timeout -s INT -k 20 430 python3 -m pytest -q -m gpu "$X::test_cuda_fixed_capacity_package_in_cuda_graphs_matches_predictor[$v]" \
      -p no:cacheprovider -p no:logging --tb=short -rfE --basetemp=/tmp/pt_$v) > "$out/tests_fixed_$v.log" 2>&1 &
  done
  timeout 440 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases training --compile-mode default --repeat 5 \
    --rows 30 > "$out/kernel_profile_training_compiled.log" 2>&1
  wait
  for d in /tmp/pt_dtype*; do
    pkg=$(ls $d/*/m.pt2 2>/dev/null | head -1); inp=$(ls $d/*/inputs.pt 2>/dev/null | head -1)
    [ -n "$pkg" ] && [ -n "$inp" ] && timeout 60 python3 benchmarks/diagnose_fixed.py "$(dirname "$pkg")" >> "$out/diagnose_fixed.log" 2>&1
  done
  ;;
edgeblocks)
  timeout 470 python3 benchmarks/diagnose_fixed.py /tmp/diagfixed > "$out/diagnose_fixed.log" 2>&1 &
  timeout -s INT -k 20 150 python3 -m pytest -q -m gpu tests/cartesian/test_triton_parity.py -k "tensor_product_parity or edge_block" \
    -p no:cacheprovider -p no:logging --tb=short -rfE > "$out/tests_parity.log" 2>&1
  timeout 200 python3 benchmarks/kernels.py --features 20 64 --backends triton --dbwd fused > "$out/kernels.log" 2>&1  # ran with --edge-blocks 1 2 4 8
  wait
  timeout 100 python3 benchmarks/eager_overhead.py --device cuda --model i2c3f20l2r --structure diamond > "$out/eager.log" 2>&1
  ;;
final3)
  gpu_tests 0 "$X::test_cuda_fixed_capacity_package_in_cuda_graphs_matches_predictor[dtype0-1e-05-True]:330" > "$out/tests_fixed.log" 2>&1
  for v in 0 1 0 1; do
    echo "=== FLASHCART_PREBOUND_LAUNCH=$v"; FLASHCART_PREBOUND_LAUNCH=$v profile_run S eager inference 45
  done > "$out/profile_eager.log" 2>&1
  ;;
nextcall)
  # one after the other: the host-bound rows (eager Predictor, TorchScript) must not share the CPU with a compile
  timeout 240 python3 benchmarks/export.py --device cuda --structures water diamond --formats torchscript --r-max 6 --repeat 50 \
    --model $S > "$out/export_torchscript.log" 2>&1
  timeout 330 python3 benchmarks/export.py --device cuda --structures diamond --formats aoti --triton --r-max 6 --repeat 50 --model $S \
    --neighbours cells --capacity dynamic > "$out/export_diamond_sized.log" 2>&1
  ;;
fixed64)
  gpu_tests 0 "$X::test_cuda_fixed_capacity_package_in_cuda_graphs_matches_predictor[dtype1-1e-10-False]:500" > "$out/tests_fixed64.log" 2>&1
  ;;
stepgrads)
  timeout 560 python3 benchmarks/compiled_step_grads.py --device cuda --model i2c3f20l2r --structure diamond --compile-mode default \
    > "$out/stepgrads.log" 2>&1
  ;;
gemms)
  timeout 500 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases training --compile-mode default --repeat 5 \
    --rows 25 --gemm-shapes > "$out/gemms_compiled.log" 2>&1 &
  timeout 200 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases inference training --repeat 5 --rows 25 \
    --gemm-shapes > "$out/gemms_eager.log" 2>&1
  wait
  ;;
fixedtime)
  timeout 560 python3 benchmarks/export.py --device cuda --structures diamond --formats aoti --triton --r-max 6 --repeat 50 --model $S \
    --neighbours cells --capacity fixed > "$out/export_diamond_fixed.log" 2>&1
  ;;
eagerab)
  timeout 300 python3 benchmarks/eager_overhead.py --device cuda --model i2c3f20l2r --structure diamond --with-profiler > "$out/eager.log" 2>&1
  for v in 0 1; do echo "=== FLASHCART_PREBOUND_LAUNCH=$v"; FLASHCART_PREBOUND_LAUNCH=$v profile_run S eager inference 45; done \
    > "$out/profile_eager.log" 2>&1
  ;;
prebounddefault)
  # the profiler first, alone on the host: the eager call is host-bound
  for r in 1 2 3; do
    for v in default 0; do
      echo "=== round $r, FLASHCART_PREBOUND_LAUNCH=$v"
      check='from flashcart.cartesian._triton import launcher; print("pre-bound launches:", launcher.ENABLED)'
      if [ $v = default ]; then (unset FLASHCART_PREBOUND_LAUNCH; python3 -c "$check"; profile_run S eager inference 60)
      else (export FLASHCART_PREBOUND_LAUNCH=0; python3 -c "$check"; profile_run S eager inference 60); fi
    done
  done > "$out/profile_eager.log" 2>&1
  gpu_tests 0 "tests/cartesian/test_launcher.py:60" "tests/model:150" > "$out/tests.log" 2>&1
  ;;
tsdense)
  gpu_tests 0 "$X -k torchscript:120" "tests/cartesian/test_architecture_products.py:200" > "$out/tests_torch.log" 2>&1
  timeout 300 python3 benchmarks/export.py --device cuda --structures water diamond --formats torchscript --r-max 6 --repeat 50 \
    --model $S > "$out/export_torchscript.log" 2>&1
  ;;
linsplit)
  gpu_tests 0 "tests/cartesian/test_triton_parity.py -k split_rules:200" > "$out/tests_split.log" 2>&1
  for m in i3c3f64l2 i2c3f20l2r; do
    timeout 150 python3 benchmarks/linear_tiles.py --model $m --split 0x2 264x2 528x2 1056x2 528x1 1056x1 2112x1
    timeout 90 python3 benchmarks/linear_tiles.py --model $m --tiles default 32x32x16x4x2:tf32x3 64x64x16x4x2:tf32x3 64x64x32x4x3:tf32x3
  done > "$out/linear_split.log" 2>&1
  timeout 120 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond > "$out/radial_pairs.log" 2>&1
  ;;
pairs)
  gpu_tests 0 "tests/model/test_gpu_model.py:200" > "$out/tests_model.log" 2>&1
  timeout 90 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond > "$out/radial_pairs.log" 2>&1
  timeout 240 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond --calls reduce-overhead \
    --rounds 9 --calls-per-round 50 > "$out/pair_calls.log" 2>&1
  ;;
csrbwd)
  gpu_tests 0 "tests/cartesian/test_triton_parity.py -k csr_backward:60" "tests/cartesian/test_triton_parity.py -k tensor_product_parity:120" \
    > "$out/tests_csr.log" 2>&1
  timeout 120 python3 benchmarks/kernels.py --features 20 64 --out-l-max 3 --backends triton --dbwd fused > "$out/kernels.log" 2>&1
  for v in 1 0; do
    echo "=== FLASHCART_FUSED_CSR_BACKWARD=$v"
    FLASHCART_FUSED_CSR_BACKWARD=$v timeout 110 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --repeat 5 --rows 14
  done > "$out/profile_eager.log" 2>&1
  ;;
csrcheck)
  gpu_tests 0 "tests/model/test_gpu_model.py:130" "tests/cartesian/test_triton_parity.py -k conv:80" > "$out/tests_csr.log" 2>&1
  ;;
afterbwd)
  # the next session's first call: the profiler's numbers for README's table after the one-pass
  # backward (i2c3f20l2r: reduce-overhead force call and training step, eager force call), the
  # plain 32x32x16 tile against the default and 3xTF32 (is the linear maps' gain the tile or the
  # precision?), then the compiled training step's kernel profile
  (profile_run S reduce-overhead both 200; profile_run S eager inference 60) > "$out/profiler.log" 2>&1
  for m in i2c3f20l2r i3c3f64l2; do
    timeout 80 python3 benchmarks/linear_tiles.py --model $m --tiles default 32x32x16x4x2 32x32x16x4x2:tf32x3
  done > "$out/linear_tiles.log" 2>&1
  timeout 240 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases training --compile-mode default \
    --repeat 5 --rows 20 > "$out/profile_training.log" 2>&1
  ;;
wrows)
  # the products reading the radial MLP's pair rows through the pair index (WeightRows): GPU parity,
  # the MLP table with the new "pairs + rows" column, the whole reduce-overhead force call both ways
  gpu_tests 0 "tests/cartesian/test_weight_rows.py:80" "tests/nn/test_edge_pairs.py:150" > "$out/tests_rows.log" 2>&1
  timeout 60 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond > "$out/radial_pairs.log" 2>&1
  timeout 240 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond --calls reduce-overhead \
    --rounds 9 --calls-per-round 50 > "$out/pair_calls.log" 2>&1
  ;;
wrows2)
  # the per-row weight gradient as one Triton pass (weight_rows_sum): GPU parity (with compiled calls), the MLP table,
  # the reduce-overhead force call per edge and per pair, each in a process of its own (one process replayed one graph)
  gpu_tests 0 "tests/cartesian/test_weight_rows.py:80" "tests/nn/test_edge_pairs.py:150" > "$out/tests_rows.log" 2>&1
  timeout 60 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond > "$out/radial_pairs.log" 2>&1
  timeout 250 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond --calls reduce-overhead \
    --rounds 9 --calls-per-round 50 > "$out/pair_calls.log" 2>&1
  ;;
rowsfinal)
  # compiled training with the pair rows (GPU parity), where a compiled force call's kernel time goes with the
  # pair rows and without (compile mode default: one process each), then the profiler's reduce-overhead numbers
  gpu_tests 0 "tests/nn/test_edge_pairs.py -k training:120" > "$out/tests_training.log" 2>&1
  for p in on off; do
    echo "=== radial pairs $p"
    timeout 110 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases inference --compile-mode default \
      --radial-pairs $p --repeat 5 --rows 24
  done > "$out/profile_pairs.log" 2>&1
  profile_run S reduce-overhead both 200 > "$out/profiler.log" 2>&1
  ;;
pairsnext)
  # the next session's first call: the compiled calls now really use the pair rows (is_exporting() was true while
  # dynamo traced CUDA calls): GPU parity of compiled force calls and a compiled training step with them, then the
  # reduce-overhead force call per edge and per pair (a process each); then part pairstrain for the training step
  gpu_tests 0 "tests/nn/test_edge_pairs.py:240" "tests/cartesian/test_weight_rows.py:80" > "$out/tests_pairs.log" 2>&1
  timeout 250 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond --calls reduce-overhead \
    --rounds 9 --calls-per-round 50 > "$out/pair_calls.log" 2>&1
  ;;
pairstrain)
  timeout 560 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond --calls reduce-overhead \
    --training --rounds 7 --calls-per-round 20 > "$out/pair_calls_training.log" 2>&1
  ;;
final4|pipeab)
  # the tensor-product forward's receiver walk software pipelined (FLASHCART_TP_PIPELINE=1) against the plain walk:
  # GPU parity (every product case to second order with the pipelined forward), the kernels on the diamond, the
  # reduce-overhead force call per pair (a process each)
  gpu_tests 0 "tests/cartesian/test_triton_parity.py:170" > "$out/tests_pipeline.log" 2>&1 &
  FLASHCART_TP_PIPELINE=1 gpu_tests 0 "tests/cartesian/test_triton_parity.py:170" > "$out/tests_pipeline_on.log" 2>&1
  wait
  for p in 0 1; do
    echo "=== FLASHCART_TP_PIPELINE=$p"
    FLASHCART_TP_PIPELINE=$p timeout 75 python3 benchmarks/kernels.py --features 20 64 --out-l-max 3 --backends triton --dbwd fused
  done > "$out/kernels_pipeline.log" 2>&1
  for p in 0 1; do
    echo "=== FLASHCART_TP_PIPELINE=$p"
    FLASHCART_TP_PIPELINE=$p timeout 100 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond \
      --calls reduce-overhead --setting pair --rounds 9 --calls-per-round 50
  done > "$out/calls_pipeline.log" 2>&1
  ;;
final5)
  # the pipelined forward's own GPU parity tests; the reduce-overhead force call per pair with the pipeline on and off,
  # inductor's caches off (so neither process reuses the other's compiled graph); the compiled training step's kernels
  gpu_tests 0 "tests/cartesian/test_triton_parity.py::test_pipelined_forward_equals_plain:90" > "$out/tests_pipeline.log" 2>&1
  for p in 1 0; do
    echo "=== FLASHCART_TP_PIPELINE=$p"
    FLASHCART_TP_PIPELINE=$p TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 110 python3 benchmarks/radial_pairs.py --device cuda \
      --model i2c3f20l2r --structure diamond --calls reduce-overhead --setting pair --rounds 9 --calls-per-round 50
  done > "$out/calls_pipeline.log" 2>&1
  FLASHCART_TP_PIPELINE=1 timeout 200 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases inference training \
    --compile-mode default --repeat 5 --rows 20 > "$out/profile_compiled.log" 2>&1
  ;;
nextgpu)
  # the next session's first call: the pipelined forward's channel-block parity test (cut at the limit on 2026-12-03),
  # the eager force call's profiler number, the compiled training step's kernels with the pairs and the pipeline,
  # and i3c3f64l2's reduce-overhead force call per pair (its first with both)
  gpu_tests 0 "tests/cartesian/test_triton_parity.py::test_pipelined_forward_equals_plain:150" > "$out/tests_pipeline.log" 2>&1
  profile_run S eager inference 60 > "$out/profiler.log" 2>&1
  timeout 200 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases training --compile-mode default \
    --repeat 3 --rows 20 > "$out/profile_training.log" 2>&1
  timeout 150 python3 benchmarks/radial_pairs.py --device cuda --model i3c3f64l2 --structure diamond --calls reduce-overhead \
    --setting pair --rounds 9 --calls-per-round 20 > "$out/calls_large.log" 2>&1
  ;;
linroute)
  # the linear maps through cuBLAS against the grouped kernel (both models, per map), GPU parity of the
  # matmul route and the narrower CSR sort, then whole force calls: i3c3f64l2 with every map as matrix
  # products (against 11.212 ms with the kernel, part nextgpu) and i2c3f20l2r with the int16 CSR sort
  gpu_tests 0 "tests/cartesian/test_triton_parity.py::test_linear_matmul_route_takes_the_maps_it_names tests/cartesian/test_operations.py tests/nn/test_edge_pairs.py:150" > "$out/tests.log" 2>&1
  for m in i3c3f64l2 i2c3f20l2r; do
    timeout 100 python3 benchmarks/linear_tiles.py --model $m --tiles default --cublas > "$out/linear_$m.log" 2>&1
  done
  FLASHCART_LINEAR_MATMUL=1 timeout 170 python3 benchmarks/radial_pairs.py --device cuda --model i3c3f64l2 --structure diamond \
    --calls reduce-overhead --setting pair --rounds 9 --calls-per-round 20 > "$out/calls_large_matmul.log" 2>&1
  timeout 110 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond --calls reduce-overhead \
    --setting pair --rounds 9 --calls-per-round 50 > "$out/calls_small.log" 2>&1
  ;;
matmulab)
  # i3c3f64l2's force call with its rank-0 maps as cuBLAS products (FLASHCART_LINEAR_MATMUL=scalar, the
  # default) and with every map through the grouped kernel (=0), a process each
  matmul_ab 160
  ;;
nextmatmul)
  # the next session's first call: the matmul route's GPU test in its scalar form and the edge-pair GPU
  # tests (cut at the limit on 2026-12-03), then the same-machine A/B of FLASHCART_LINEAR_MATMUL that
  # part matmulab could not finish
  gpu_tests 0 "tests/cartesian/test_triton_parity.py::test_linear_matmul_route_takes_the_maps_it_names tests/nn/test_edge_pairs.py:200" > "$out/tests.log" 2>&1
  matmul_ab 170
  ;;
rowsum)
  # the kernels add each edge's weight gradient into its pair row (FLASHCART_WEIGHT_ROW_SUM=atomic, default) against
  # the separate row-sum pass (=pass): GPU parity (bit-equal float32 row sums, second order in float64) with the matmul
  # route's scalar-form test, then i2c3f20l2r's reduce-overhead force call per pair, a process each, caches off
  gpu_tests 0 "tests/cartesian/test_weight_rows.py tests/cartesian/test_triton_parity.py::test_linear_matmul_route_takes_the_maps_it_names:150" > "$out/tests.log" 2>&1
  for m in atomic pass; do
    echo "=== FLASHCART_WEIGHT_ROW_SUM=$m"
    FLASHCART_WEIGHT_ROW_SUM=$m TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 120 python3 benchmarks/radial_pairs.py --device cuda \
      --model i2c3f20l2r --structure diamond --calls reduce-overhead --setting pair --rounds 9 --calls-per-round 50
  done > "$out/calls_rowsum.log" 2>&1
  ;;
rowtrain)
  # the compiled training step's kernels with the weight-row sums in the kernels (=atomic) and in their own pass (=pass)
  for m in atomic pass; do
    FLASHCART_WEIGHT_ROW_SUM=$m timeout 210 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases training \
      --compile-mode default --repeat 3 --rows 25 > "$out/profile_training_$m.log" 2>&1
  done
  ;;
splits)
  # each node's edges walked by several programs (FLASHCART_TP_SPLITS): GPU parity (with the weight-row determinism
  # test), the convolution kernels at 1, 4, 2 and 8 splits (as far as the limit allows), then i2c3f20l2r's reduce-overhead force call per pair at
  # 1 and 4 splits (a process each, caches off)
  gpu_tests 0 "tests/cartesian/test_triton_parity.py::test_split_walks_equal_the_reference tests/cartesian/test_weight_rows.py::test_kernels_sum_rows_deterministically:100" > "$out/tests.log" 2>&1
  timeout 170 python3 benchmarks/kernels.py --features 20 64 --out-l-max 3 --backends triton --dbwd fused --splits 1 4 2 8 > "$out/kernels_splits.log" 2>&1
  for n in 1 4; do
    echo "=== FLASHCART_TP_SPLITS=$n"
    FLASHCART_TP_SPLITS=$n TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 110 python3 benchmarks/radial_pairs.py --device cuda \
      --model i2c3f20l2r --structure diamond --calls reduce-overhead --setting pair --rounds 9 --calls-per-round 50
  done > "$out/calls_splits.log" 2>&1
  ;;
final6)
  # the session's last call: GPU parity of the split walks (part splits ran out of its 100 s) and the weight rows' determinism,
  # then the compiled training step's kernels with the double backward split 4 ways and the row sums in the kernels (defaults)
  gpu_tests 0 "tests/cartesian/test_triton_parity.py::test_split_walks_equal_the_reference tests/cartesian/test_weight_rows.py::test_kernels_sum_rows_deterministically:180" > "$out/tests.log" 2>&1
  timeout 200 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases training --compile-mode default \
    --repeat 3 --rows 25 > "$out/profile_training.log" 2>&1
  ;;
nextsplits)
  # the next session's first call: the weight rows' determinism test on the GPU (cut at the limit on 2026-12-03), the
  # kernels at 64 channels split 1 and 4 ways (not reached that day), the reduce-overhead force call with the defaults
  gpu_tests 0 "tests/cartesian/test_weight_rows.py::test_kernels_sum_rows_deterministically:120" > "$out/tests.log" 2>&1
  timeout 150 python3 benchmarks/kernels.py --features 64 --out-l-max 3 --backends triton --dbwd fused --splits 1 4 > "$out/kernels_splits64.log" 2>&1
  timeout 120 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond --calls reduce-overhead \
    --setting pair --rounds 9 --calls-per-round 50 > "$out/calls_small.log" 2>&1
  ;;
owner)
  # weight rows stored once by their owner edge (2026-12-03 afternoon; measured slower and removed, see RESULTS.md): the
  # parity tests, the convolution kernels with per-pair rows in each row-sum mode, the linear maps' tiles at 20 channels
  gpu_tests 0 "tests/cartesian/test_weight_rows.py:170" > "$out/tests.log" 2>&1
  timeout 200 python3 benchmarks/kernels.py --features 20 64 --out-l-max 3 --backends triton --dbwd fused --row-sums atomic pass \
    > "$out/kernels_rows.log" 2>&1
  timeout 100 python3 benchmarks/linear_tiles.py --model i2c3f20l2r --tiles default 32x32x32x4x1 32x32x64x4x1 16x32x64x2x1 16x32x128x2x1 \
    32x32x128x4x1 64x32x64x4x1 > "$out/linear_tiles.log" 2>&1
  ;;
trainratio)
  # the weight rows' determinism test on the GPU (atomic against pass), then the compiled training step with the parameter
  # gradients by the outer backward (the trainer's way: the positions' gradient computed and dropped) against inside the graph
  gpu_tests 0 "tests/cartesian/test_weight_rows.py::test_kernels_sum_rows_deterministically:90" > "$out/tests.log" 2>&1
  timeout 440 python3 benchmarks/compiled_step_grads.py --device cuda --model i2c3f20l2r --structure diamond --compile-mode default \
    > "$out/stepgrads.log" 2>&1
  ;;
stepgraph)
  # the trainer's compiled step (Predictor.loss_and_grads, reduce-overhead) against the eager outer backward's gradients
  timeout 250 python3 benchmarks/compiled_step_grads.py --device cuda --model i2c3f20l2r --structure diamond \
    --compile-mode reduce-overhead --ways eager in-graph --repeat 20 > "$out/stepgraph.log" 2>&1
  ;;
stepgraphtiny)
  # the short form of part stepgraph (for a call with little device time left): the tiny model on ethanol
  timeout 140 python3 benchmarks/compiled_step_grads.py --device cuda --model tiny --structure ethanol \
    --compile-mode reduce-overhead --ways eager in-graph --repeat 20 > "$out/stepgraph_tiny.log" 2>&1
  ;;
nextstep)
  # the next session's first call: i2c3f20l2r's reduce-overhead force call and training step (the trainer's way, the gradients
  # inside the compiled graph) per pair in one process: the training / inference target
  timeout 420 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond --calls reduce-overhead \
    --training --setting pair --rounds 7 --calls-per-round 20 > "$out/calls_training.log" 2>&1
  ;;
unittiles)
  # with the contiguous axes (16-byte copies) the 64 x 64 x 16 tile's loop issues a shared-memory load per 3.3 FMAs (156 per 512, sm_90 PTX):
  # tiles with more outputs per thread (fewer warps or larger tiles) against the default, both models (about 3 minutes)
  (cd benchmarks && for m in i3c3f64l2 i2c3f20l2r; do
    timeout 120 python3 linear_tiles.py --model $m --tiles default 64x64x16x2x2 128x64x16x4x2 64x128x16x4x2 128x128x16x8x2 \
      64x64x32x2x3 32x64x16x2x2 32x32x16x2x2 32x32x16x1x2
  done) > "$out/linear_unit_tiles.log" 2>&1
  ;;
dbwdgroups)
  # the trainer's step (in-graph, reduce-overhead) with the double backward's receiver pass in one program per receiver
  # (default: 255 registers and 232 bytes of spills for sm_90 without d x2) against one per output rank (179, none)
  for mode in 1 grouped; do
    echo "=== FLASHCART_FUSED_DOUBLE_BACKWARD=$mode"
    FLASHCART_FUSED_DOUBLE_BACKWARD=$mode TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 260 python3 benchmarks/radial_pairs.py \
      --device cuda --model i2c3f20l2r --structure diamond --calls reduce-overhead --training --setting pair --rounds 7 --calls-per-round 20
  done > "$out/dbwd_groups.log" 2>&1
  ;;
profile2)
  # issue 14 item 1 for the trainer's step: the compiled force call's and the in-graph training step's kernels
  # (Predictor.loss_and_grads), both published models side by side (compiles in parallel, profiles in turn: --lock)
  for m in i2c3f20l2r i3c3f64l2; do
    timeout 540 python3 benchmarks/kernel_profile.py --device cuda --model $m --phases inference training-in-graph \
      --compile-mode default --repeat 5 --rows 45 --lock /tmp/profile.lock > "$out/profile_$m.log" 2>&1 &
  done
  wait
  ;;
ncu)
  # issue 14 item 1 with hardware counters: ncu on i2c3f20l2r's compiled force call and training step and i3c3f64l2's
  # force call (DRAM bytes, FP32 FMAs, throughput per kernel: benchmarks/ncu_call.py); first, holding the GPU lock
  # that the profiled calls take, the fifth fused double backward GPU parity case (cut at its limit last time)
  ( exec 9>>/tmp/profile.lock; flock 9
    gpu_tests 0 "tests/cartesian/test_fused_double_backward.py::test_fused_double_backward_parity_on_gpu:200" ) > "$out/tests.log" 2>&1 &
  sleep 3
  ncu_calls 540 "" "i2c3f20l2r inference" "i2c3f20l2r training-in-graph" "i3c3f64l2 inference"
  ;;
ncu2)
  # the rest of part ncu in a short call: the training step's products, linear maps and GEMMs only (ncu --kernel-name),
  # and i3c3f64l2's force call the same way; the summaries before the call's limit
  ncu_calls 320 "regex:tp_|gemm|grouped_matmul|splitK" "i2c3f20l2r training-in-graph" "i3c3f64l2 inference"
  ;;
ncu3)
  # the shortest ncu call: i2c3f20l2r's compiled force call, the products' launches one by one (registers, grid,
  # bytes: which variant of each kernel runs where; about 2 minutes)
  ncu_calls 150 "regex:tp_|expansion" "i2c3f20l2r inference"
  ;;
splitsparity)
  # the next session's first call: GPU parity of the default auto walk splits (the 4-path convolution split 4 ways,
  # to second order in float64), the split walks and the fused double backward's conv-l3 case (it needs about
  # 180 s to compile and run: 2026-12-04), then the convolution kernels at the defaults (about 8 minutes)
  T=tests/cartesian/test_triton_parity.py
  gpu_tests 0 "$T::test_auto_split_walks_equal_the_reference $T::test_split_walks_equal_the_reference:200" \
    "tests/cartesian/test_fused_double_backward.py::test_fused_double_backward_parity_on_gpu[conv-l3]:240" > "$out/tests.log" 2>&1
  timeout 60 python3 benchmarks/kernels.py --features 20 --out-l-max 3 --backends triton --dbwd fused --row-sums atomic \
    > "$out/kernels.log" 2>&1
  ;;
prefetch)
  # the node walks' index prefetch (FLASHCART_INDEX_PREFETCH): its GPU parity (float64, to second order), the published
  # convolution's kernels with it off and on (F = 20 and 64), then i2c3f20l2r's reduce-overhead force call, a process
  # per setting (about 7 minutes)
  gpu_tests 0 "tests/cartesian/test_triton_parity.py::test_index_prefetch_equals_the_reference:150" > "$out/tests.log" 2>&1
  timeout 150 python3 benchmarks/kernels.py --features 20 64 --out-l-max 3 --backends triton --dbwd fused --row-sums atomic \
    --prefetch 0 1 > "$out/kernels.log" 2>&1
  env_ab FLASHCART_INDEX_PREFETCH "0 1" 100 > "$out/calls_prefetch.log" 2>&1
  ;;
prefetch2)
  # FLASHCART_INDEX_PREFETCH=auto (the default: per kernel, common.index_prefetch) against 0: the published convolution's
  # kernels at F = 20 and 64, then i2c3f20l2r's reduce-overhead force call and training step, a process per setting
  # (about 9 minutes)
  timeout 120 python3 benchmarks/kernels.py --features 20 64 --out-l-max 3 --backends triton --dbwd fused --row-sums atomic \
    --prefetch 0 auto > "$out/kernels.log" 2>&1
  env_ab FLASHCART_INDEX_PREFETCH "0 auto" 230 --training > "$out/calls_prefetch_training.log" 2>&1
  ;;
splitsauto)
  # FLASHCART_TP_SPLITS=auto (walk splits by path count: the 4-path first convolution split 4 ways): the products'
  # launches under ncu with auto, then i2c3f20l2r's reduce-overhead force call with 1 and auto splits (a process
  # each, caches off; about 5 minutes); part splitsautotrain times the trainer's step the same way
  FLASHCART_TP_SPLITS=auto ncu_calls 120 "regex:tp_" "i2c3f20l2r inference"
  splits_ab 90 > "$out/calls_splits.log" 2>&1
  ;;
splitsautotrain)
  # the trainer's reduce-overhead step (and the force call) with FLASHCART_TP_SPLITS 1 and auto, a process each (about 9 minutes)
  splits_ab 280 --training > "$out/calls_splits_training.log" 2>&1
  ;;
verify3)
  # the next session's first call: the compiled model's GPU parity and the linear maps' GPU parity after the review
  # commit (grouped_matmul's UNIT/ALIGN without defaults), then part unittiles (about 8 minutes)
  gpu_tests 0 tests/model:140 "tests/cartesian/test_triton_parity.py -k linear:110" > "$out/tests.log" 2>&1
  (cd benchmarks && for m in i3c3f64l2 i2c3f20l2r; do
    timeout 110 python3 linear_tiles.py --model $m --tiles default 64x64x16x2x2 128x64x16x4x2 64x128x16x4x2 \
      64x64x32x2x3 32x64x16x2x2 32x32x16x2x2 32x32x16x1x2
  done) > "$out/linear_unit_tiles.log" 2>&1
  ;;
engineneeds)
  # compiled backward passes ask the autograd engine which results they reach (as eager ones did): GPU parity of the
  # fused double backward and of a compiled training step against eager, then i2c3f20l2r's reduce-overhead force call
  # and the trainer's in-graph step per pair in one process, inductor's caches off (about 8 minutes)
  gpu_tests 0 "tests/cartesian/test_fused_double_backward.py tests/nn/test_edge_pairs.py::test_compiled_training_with_pairs_on_gpu:200" \
    > "$out/tests.log" 2>&1
  TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 330 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond \
    --calls reduce-overhead --training --setting pair --rounds 7 --calls-per-round 20 > "$out/calls_training.log" 2>&1
  ;;
geomdump)
  geomdump 200
  ;;
edgesdefault)
  # the fused edge features now on by default (FLASHCART_FUSED_EDGES unset): their GPU parity (the float64 gradient
  # comparison without the zero-length edge's cancelling terms, that edge alone exactly zero), tests/model's GPU tests,
  # the integrations' GPU tests (the physics battery, the engines and OpenMM's CUDA platform), then the eager force call
  # with them and with the ATen edge features, interleaved in one process (about 8 minutes)
  gpu_tests 0 "tests/nn/test_edge_features.py:100" tests/model:140 tests/integrations/test_gpu.py:220 > "$out/tests.log" 2>&1
  timeout 150 python3 benchmarks/eager_overhead.py --device cuda --model i2c3f20l2r --structure diamond \
    --variants prebound atenedges --rounds 10 --rows 30 > "$out/eager.log" 2>&1
  ;;
radialtable)
  # tabulated radial MLPs (flashcart.nn.radial_table; benchmarks/radial_table.py measured their accuracy on the CPU):
  # the GPU test, then the profiler's reduce-overhead force call without and with 4096-interval tables, a process each
  gpu_tests 0 "tests/model/test_gpu_model.py::test_radial_tables_on_gpu_compiled_and_eager:150" > "$out/tests.log" 2>&1
  for k in 0 4096 0 4096; do profile_run S reduce-overhead inference 110 profile_radial_table=$k; done > "$out/profile_tables.log" 2>&1
  ;;
radialquick)
  # part radialtable cut to fit about 4 minutes: the GPU test, then the force call with tables, then without
  gpu_tests 0 "tests/model/test_gpu_model.py::test_radial_tables_on_gpu_compiled_and_eager:100" > "$out/tests.log" 2>&1
  for k in 4096 0; do profile_run S reduce-overhead inference 90 profile_radial_table=$k; done > "$out/profile_tables.log" 2>&1
  ;;
layout)
  # (2026-12-05 on an H100: two reduce-overhead compiles of the diamond call in one process took more than 140 s)
  timeout 400 python3 benchmarks/edge_layout.py --device cuda --model i2c3f20l2r --structure diamond \
    --compile-mode reduce-overhead --radial-table 4096 --rounds 10 --calls 20 > "$out/layout_ab.log" 2>&1
  gpu_tests 0 "tests/model/test_gpu_model.py::test_compiled_equals_eager_on_gpu tests/model/test_gpu_model.py::test_radial_tables_on_gpu_compiled_and_eager:190" > "$out/tests.log" 2>&1
  ;;
layout2)
  table_ab 110 FLASHCART_EDGE_LAYOUT=1 FLASHCART_EDGE_LAYOUT=0 > "$out/profile_layout.log" 2>&1
  timeout 170 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases inference --compile-mode default \
    --repeat 5 --rows 50 --radial-table 4096 > "$out/kernels_tables.log" 2>&1
  ;;
layoutwhy)
  # part layout's A/B had the layout once per list 0.5 ms slower (2.498 against 1.993 ms): the same A/B with the other
  # setting compiled first, dynamo's perf hints (cudagraph skips) and each setting's calls under torch.profiler; then
  # the profiler's reduce-overhead force call with tables, FLASHCART_EDGE_LAYOUT 1 and 0, a process each (about 9 minutes)
  TORCH_LOGS=perf_hints timeout 290 python3 benchmarks/edge_layout.py --device cuda --model i2c3f20l2r --structure diamond \
    --compile-mode reduce-overhead --radial-table 4096 --rounds 6 --calls 20 --first every --profile 5 > "$out/layout_why.log" 2>&1
  table_ab 110 FLASHCART_EDGE_LAYOUT=1 FLASHCART_EDGE_LAYOUT=0 > "$out/profile_layout.log" 2>&1
  ;;
layoutfix)
  # after the fusion barrier on the tables' lengths (flashcart.nn.fusion_barrier): the layout A/B with tables and with
  # the radial MLPs, then the tables' GPU test (compiled against eager, the new op in the graph; about 8 minutes)
  for k in 4096 0; do
    timeout 170 python3 benchmarks/edge_layout.py --device cuda --model i2c3f20l2r --structure diamond \
      --compile-mode reduce-overhead --radial-table $k --rounds 8 --calls 20 > "$out/layout_ab_$k.log" 2>&1
  done
  gpu_tests 0 "tests/model/test_gpu_model.py::test_radial_tables_on_gpu_compiled_and_eager:150" > "$out/tests.log" 2>&1
  ;;
layoutprofile)
  # the profiler's reduce-overhead force call with the layout once per list and the barrier, with tables and without
  # (about 4 minutes)
  for k in 4096 0; do profile_run S reduce-overhead inference 110 profile_radial_table=$k; done > "$out/profile_layout.log" 2>&1
  ;;
layouttrain)
  # the profiler's reduce-overhead training step with the layout once per list (about 4 minutes)
  profile_run S reduce-overhead training 220 > "$out/profile_training.log" 2>&1
  ;;
steptrain)
  # i2c3f20l2r's reduce-overhead force call and the trainer's step (gradients in the graph) in one process, with the
  # layout once per list (the training target's ratio; about 4 minutes)
  timeout 270 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond --calls reduce-overhead \
    --training --setting pair --rounds 7 --calls-per-round 20 > "$out/calls_training.log" 2>&1
  ;;
h200next)
  # the README's H200 figures after the layout and the fusion barrier: the profiler's reduce-overhead force call with
  # tables and with the MLPs, the force call and the trainer's step in one process, the eager force call (about 7 minutes;
  # the first run compiles the kernels cold: 170 s, 110 s was too short for the table in the kernels on 2026-12-06)
  profile_run S reduce-overhead inference 170 profile_radial_table=4096 > "$out/profile_compiled.log" 2>&1
  profile_run S reduce-overhead inference 110 profile_radial_table=0 >> "$out/profile_compiled.log" 2>&1
  timeout 200 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond --calls reduce-overhead \
    --training --setting pair --rounds 7 --calls-per-round 20 > "$out/calls_training.log" 2>&1
  profile_run S eager inference 60 > "$out/profile_eager.log" 2>&1
  ;;
prefetchtrain)
  # FLASHCART_INDEX_PREFETCH 0 against auto (the default) in the trainer's reduce-overhead step (and the force call), a
  # process each, caches off (about 8 minutes)
  env_ab FLASHCART_INDEX_PREFETCH "0 auto" 260 --training > "$out/calls_prefetch_training.log" 2>&1
  ;;
edges)
  # the edge features as two Triton kernels (flashcart.nn.edge_kernels, FLASHCART_FUSED_EDGES, eager only; not yet run on
  # a GPU): GPU parity (float64 1e-12 to second order, float32; a whole force-and-stress call with and without; the RMS
  # norm and gate, whose eps constant is now built by common.kernel_constants), then the
  # eager force call with them and without, interleaved in one process, and the profiler's eager force call in processes
  # of its own with each setting; the compiled call's geometry kernel for comparison (about 8 minutes)
  gpu_tests 0 "tests/nn/test_edge_features.py tests/cartesian/test_rowwise.py:180" > "$out/tests.log" 2>&1
  timeout 200 python3 benchmarks/eager_overhead.py --device cuda --model i2c3f20l2r --structure diamond \
    --variants atenedges prebound --rounds 10 --rows 30 > "$out/eager.log" 2>&1
  for r in 1 2; do for f in 0 1; do
    echo "FLASHCART_FUSED_EDGES=$f"; (export FLASHCART_FUSED_EDGES=$f; profile_run S eager inference 50)
  done; done > "$out/profile_eager.log" 2>&1
  geomdump 120
  ;;
rmsforms)
  # the RMS norm's invariants evaluated in its row-wise kernel (quadratic forms, no tensor-product launch): GPU parity
  # (float64 1e-12 to second order, float32; a whole force call with and without the kernels), tests/model's GPU
  # tests, then the eager force call with the kernels and without (ATen norm and gate, no cache), interleaved in one
  # process, and the profiler's eager force call in processes of its own (about 6 minutes)
  gpu_tests 0 "tests/cartesian/test_rowwise.py:90" "tests/model:150" > "$out/tests.log" 2>&1
  timeout 150 python3 benchmarks/eager_overhead.py --device cuda --model i2c3f20l2r --structure diamond \
    --variants prebound unfused --rounds 8 --rows 25 > "$out/eager.log" 2>&1
  for r in 1 2; do profile_run S eager inference 50; done > "$out/profile_eager.log" 2>&1
  ;;
eagersync)
  # where the eager force call waits for the GPU (torch.cuda.set_sync_debug_mode) and a cProfile of its host work (about 3 minutes)
  timeout 120 python3 benchmarks/eager_overhead.py --device cuda --model i2c3f20l2r --structure diamond --sync-debug > "$out/sync.log" 2>&1
  timeout 150 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases inference --repeat 2 \
    --host-profile 10 --rows 45 > "$out/host_profile.log" 2>&1
  ;;
eagernext)
  # the eager force call with every change, with its Triton launches skipped (the rest's host cost) and with the ATen
  # norm and gate without the cache, interleaved in one process; then i2c3f20l2r's reduce-overhead force call and the
  # trainer's step in one process (the compiled path after the weight-scale folds and the launch plans; about 8 minutes)
  timeout 200 python3 benchmarks/eager_overhead.py --device cuda --model i2c3f20l2r --structure diamond \
    --variants prebound nolaunch unfused --rounds 8 --rows 30 > "$out/eager.log" 2>&1
  TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 300 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r \
    --structure diamond --calls reduce-overhead --training --setting pair --rounds 7 --calls-per-round 20 > "$out/calls_training.log" 2>&1
  ;;
rowwise)
  # the RMS norm's and the gate's fused row-wise kernels (flashcart.cartesian._triton.rowwise, eager only) and the grouped
  # matmul's cached launch plans: GPU parity (float64 1e-12, float32), tests/model's GPU tests (compiled == eager, now
  # against the fused kernels), the linear maps' parity and the pre-bound launcher; then the eager force call with
  # everything, without the frozen-parameter cache, and with neither (ATen norm and gate), interleaved in one process;
  # the profiler's eager force call in processes of its own (about 9 minutes)
  gpu_tests 0 "tests/cartesian/test_rowwise.py tests/cartesian/test_launcher.py:120" "tests/model:150" \
    "tests/cartesian/test_triton_parity.py -k linear:90" > "$out/tests.log" 2>&1
  timeout 200 python3 benchmarks/eager_overhead.py --device cuda --model i2c3f20l2r --structure diamond \
    --variants prebound uncached unfused --rounds 8 --rows 45 > "$out/eager.log" 2>&1
  for r in 1 2 3; do profile_run S eager inference 50; done > "$out/profile_eager.log" 2>&1
  ;;
eagercache)
  # tensors derived from frozen parameters built once (flashcart.cartesian._frozen): the eager force call with the cache
  # and without, interleaved in one process, with its host breakdown; the profiler's eager force call in processes of
  # its own (cache on, the default); tests/model's GPU tests (about 7 minutes)
  timeout 240 python3 benchmarks/eager_overhead.py --device cuda --model i2c3f20l2r --structure diamond \
    --variants prebound uncached --rounds 10 --rows 45 > "$out/eager.log" 2>&1
  for r in 1 2 3; do profile_run S eager inference 60; done > "$out/profile_eager.log" 2>&1
  gpu_tests 0 "tests/model:150" > "$out/tests.log" 2>&1
  ;;
ddp)
  timeout 540 python3 benchmarks/ddp_scaling.py --device gpu --devices 1 2 --epochs 3 > "$out/ddp.log" 2>&1
  ;;
slopes)
  # the tables' slopes contracted in the products' backward kernels (W_SLOPE, FLASHCART_TABLE_SLOPES): GPU parity
  # (float64 1e-12 against autograd through the slopes, every call path; the model with tables, compiled and eager),
  # then the profiler's reduce-overhead force call with 4096-interval tables, slopes 1 and 0, a process each (about 8 minutes)
  gpu_tests 0 "tests/cartesian/test_weight_slopes.py tests/cartesian/test_triton_parity.py::test_expansion_parity tests/model/test_gpu_model.py::test_radial_tables_on_gpu_compiled_and_eager:250" \
    > "$out/tests.log" 2>&1
  table_ab 110 FLASHCART_TABLE_SLOPES=1 FLASHCART_TABLE_SLOPES=0 > "$out/profile_slopes.log" 2>&1
  ;;
slopesnext)
  # next session (an H200 if one comes): the profiler's reduce-overhead force call with tables (slopes on, the default) and
  # with the MLPs, the trainer's step beside the force call, the kernel list with tables and slopes (about 9 minutes)
  for k in 4096 0; do profile_run S reduce-overhead inference 110 profile_radial_table=$k; done > "$out/profile_compiled.log" 2>&1
  timeout 200 python3 benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond --calls reduce-overhead \
    --training --setting pair --rounds 7 --calls-per-round 20 > "$out/calls_training.log" 2>&1
  timeout 150 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases inference --compile-mode default \
    --repeat 5 --rows 50 --radial-table 4096 > "$out/kernels_tables.log" 2>&1
  ;;
tablekernel)
  gpu_tests 0 "tests/cartesian/test_weight_table.py tests/model/test_gpu_model.py::test_radial_tables_on_gpu_compiled_and_eager:200" \
    > "$out/tests.log" 2>&1
  table_ab 110 FLASHCART_TABLE_KERNEL=1 FLASHCART_TABLE_KERNEL=0 > "$out/profile_tablekernel.log" 2>&1
  timeout 130 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases inference --compile-mode default \
    --repeat 5 --rows 40 --radial-table 4096 > "$out/kernels_tables.log" 2>&1
  ;;
tablenext)
  gpu_tests 0 "tests/cartesian/test_weight_table.py tests/cartesian/test_weight_slopes.py:250" \
    "tests/model/test_gpu_model.py::test_radial_tables_on_gpu_compiled_and_eager tests/model/test_gpu_model.py::test_static_lists_in_reduce_overhead_calls:220" \
    > "$out/tests.log" 2>&1
  ;;
staticab)
  # static lists on and off, each with the one-pass backward and with the two-kernel backward (no spill with a table)
  table_ab 150 "FLASHCART_STATIC_LIST=1 FLASHCART_FUSED_CSR_BACKWARD=1" "FLASHCART_STATIC_LIST=0 FLASHCART_FUSED_CSR_BACKWARD=1" \
    "FLASHCART_STATIC_LIST=1 FLASHCART_FUSED_CSR_BACKWARD=0" "FLASHCART_STATIC_LIST=0 FLASHCART_FUSED_CSR_BACKWARD=0" > "$out/profile_static.log" 2>&1
  ;;
afternoon1)
  # one call (<= 10 min) on a short budget: the tables' GPU parity after the op merge, the static lists' GPU test, then the
  # static lists' A/B with the one-pass backward; afternoon2 has the two-kernel backward and the kernel list
  gpu_tests 0 "tests/cartesian/test_weight_table.py tests/model/test_gpu_model.py::test_radial_tables_on_gpu_compiled_and_eager tests/model/test_gpu_model.py::test_static_lists_in_reduce_overhead_calls:290" \
    > "$out/tests.log" 2>&1
  table_ab 130 FLASHCART_STATIC_LIST=1 FLASHCART_STATIC_LIST=0 > "$out/profile_static.log" 2>&1
  ;;
afternoon2)
  table_ab 130 "FLASHCART_STATIC_LIST=1 FLASHCART_FUSED_CSR_BACKWARD=0" "FLASHCART_STATIC_LIST=0 FLASHCART_FUSED_CSR_BACKWARD=0" \
    "FLASHCART_STATIC_LIST=1 FLASHCART_FUSED_CSR_BACKWARD=1" > "$out/profile_bwd.log" 2>&1
  timeout 150 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases inference --compile-mode default \
    --repeat 5 --rows 80 --radial-table 4096 > "$out/kernels_tables.log" 2>&1
  ;;
normforms)
  # FLASHCART_NORM_FORMS: the RMS norm's invariants as quadratic forms in inductor's kernels in compiled calls, instead of
  # a symmetric product launch each way (4 norms in i2c3f20l2r: 8 product launches). GPU test, then graph_bound A/B/A
  # (tables, unpadded as the profiler), then the kernel list with the forms
  gpu_tests 0 "tests/model/test_gpu_model.py::test_compiled_settings_on_gpu[norm-forms]:200" > "$out/tests.log" 2>&1
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
short)
  # part one in about 7 minutes (a lease with little device time left): graph_bound unpadded with tables, static lists
  # 0 then 1 (the profiler's "pipelined" s/run), the static lists' GPU test (padded, unpadded), then the norm forms on
  FLASHCART_STATIC_LIST=0 timeout 170 python3 benchmarks/graph_bound.py --device cuda --model i2c3f20l2r --radial-table 4096 \
    --rounds 5 > "$out/bound_static0.log" 2>&1
  FLASHCART_STATIC_LIST=1 timeout 75 python3 benchmarks/graph_bound.py --device cuda --model i2c3f20l2r --radial-table 4096 \
    --rounds 5 > "$out/bound_static1.log" 2>&1
  gpu_tests 0 "tests/model/test_gpu_model.py::test_static_lists_in_reduce_overhead_calls:${SHORT_TEST_S:-110}" > "$out/tests_static.log" 2>&1
  [ -n "$SHORT_NO_FORMS" ] || FLASHCART_NORM_FORMS=1 timeout 75 python3 benchmarks/graph_bound.py --device cuda --model i2c3f20l2r --radial-table 4096 \
    --rounds 5 > "$out/bound_forms1.log" 2>&1
  ;;
one)
  # parts night1 and night2 cut to one call (a session with little device time): graph_bound with tables, unpadded as the
  # profiler (its "pipelined" line is the profiler's s/run): norm forms 0 and static lists 0 (with the host's cProfile),
  # then static lists 1 (unpadded static lists: the Predictor's copies of the list at fixed addresses), then forms 1; the
  # GPU tests of static lists (padded, unpadded) and of the forms; the host/GPU split's GPU test. Logs written as they run.
  FLASHCART_NORM_FORMS=0 FLASHCART_STATIC_LIST=0 timeout 190 python3 benchmarks/graph_bound.py --device cuda --model i2c3f20l2r \
    --radial-table 4096 --cprofile 10 > "$out/bound_forms0_static0.log" 2>&1
  FLASHCART_NORM_FORMS=0 FLASHCART_STATIC_LIST=1 timeout 90 python3 benchmarks/graph_bound.py --device cuda --model i2c3f20l2r \
    --radial-table 4096 > "$out/bound_forms0_static1.log" 2>&1
  FLASHCART_NORM_FORMS=1 FLASHCART_STATIC_LIST=0 timeout 90 python3 benchmarks/graph_bound.py --device cuda --model i2c3f20l2r \
    --radial-table 4096 > "$out/bound_forms1_static0.log" 2>&1
  gpu_tests 0 "tests/model/test_gpu_model.py::test_static_lists_in_reduce_overhead_calls tests/model/test_gpu_model.py::test_compiled_settings_on_gpu[norm-forms]:170" \
    > "$out/tests_model.log" 2>&1
  gpu_tests 0 "tests/test_profiler.py::test_host_gpu_split_on_cuda:50" > "$out/tests_hostgpu.log" 2>&1
  ;;
static)
  # 2026-12-07 (about 9.5 minutes): FLASHCART_STATIC_SHAPES, the products' kernels compiled for their sizes (channels and
  # row widths as constexprs: no address arithmetic per load; for sm_90 the one-pass backward at 20 channels 128
  # registers without spills instead of 255 with 256 spilled bytes). The published convolution's kernels (forward,
  # backward, fused double backward; per-pair rows, 20 and 64 channels) without and with it, a process each; with it
  # the walks split 2 and 4 ways at 20 channels (fewer registers: more warps fit, so more programs may now pay); the
  # GPU parity with it (float64: Triton == PyTorch to second order, the tables, the fused double backward)
  for v in 0 1; do
    FLASHCART_STATIC_SHAPES=$v timeout 130 python3 benchmarks/kernels.py --features 20 64 --out-l-max 3 --backends triton --dbwd fused \
      --row-sums atomic > "$out/kernels_shapes$v.log" 2>&1
  done
  [ -n "$STATIC_SHORT" ] || FLASHCART_STATIC_SHAPES=1 timeout 110 python3 benchmarks/kernels.py --features 20 --out-l-max 3 --backends triton \
    --dbwd fused --row-sums atomic --splits 2 4 > "$out/kernels_shapes1_splits.log" 2>&1
  FLASHCART_STATIC_SHAPES=1 gpu_tests 0 "tests/cartesian/test_triton_parity.py tests/cartesian/test_weight_table.py tests/cartesian/test_fused_double_backward.py:160" \
    > "$out/tests_shapes.log" 2>&1
  ;;
static2)
  # after part static: the profiler's call without and with static shapes (graph_bound, tables, unpadded: its "pipelined"
  # line is the profiler's s/run), the model's GPU tests with them (Triton == PyTorch with training gradients, compiled ==
  # eager, tables), the training step's kernels with them
  FLASHCART_STATIC_SHAPES=0 FLASHCART_STATIC_LIST=0 bound_s 170 bound_shapes0.log --rounds 5
  FLASHCART_STATIC_SHAPES=1 FLASHCART_STATIC_LIST=0 bound_s 110 bound_shapes1.log --rounds 5
  FLASHCART_STATIC_SHAPES=1 gpu_tests 0 "tests/model/test_gpu_model.py:200" > "$out/tests_model_shapes.log" 2>&1
  FLASHCART_STATIC_SHAPES=1 timeout 120 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases training \
    --compile-mode default --repeat 5 --rows 30 > "$out/kernels_training_shapes.log" 2>&1
  ;;
static3)
  # 2026-12-07 afternoon, after part static (H100: static shapes took the fused double backward from 1.509 to 1.119 ms at 20
  # channels, and with every walk split 4 ways the backward from 0.618 to 0.544 ms): the profiler's call (graph_bound, tables,
  # unpadded) without static shapes, then with them and 4 splits; then the model's GPU tests and the fused double
  # backward's and the tables' parity with them (float64)
  FLASHCART_STATIC_SHAPES=0 FLASHCART_STATIC_LIST=0 bound_s 170 bound_shapes0.log --rounds 5
  FLASHCART_STATIC_SHAPES=1 FLASHCART_TP_SPLITS=4 FLASHCART_STATIC_LIST=0 bound_s 120 bound_shapes1_splits4.log --rounds 5
  FLASHCART_STATIC_SHAPES=1 FLASHCART_TP_SPLITS=4 gpu_tests 0 "tests/model/test_gpu_model.py:150" \
    "tests/cartesian/test_fused_double_backward.py tests/cartesian/test_weight_table.py:110" > "$out/tests_shapes_model.log" 2>&1
  ;;
defaults)
  # next after 2026-12-07 afternoon (about 9.5 minutes): the GPU parity the static3 lease's limits cut off, under the new
  # defaults (static shapes on, 4 walk splits at up to 32 channels): the model's table and static-list GPU tests and its
  # compiled opt-in settings (norm forms, combined kernels, linear pairs: compiled == eager with training gradients), then
  # the tables', the fused double backward's and the linear pairs' GPU tests
  gpu_tests 0 "tests/model/test_gpu_model.py::test_radial_tables_on_gpu_compiled_and_eager tests/model/test_gpu_model.py::test_static_lists_in_reduce_overhead_calls tests/model/test_gpu_model.py::test_compiled_settings_on_gpu:330" \
    "tests/cartesian/test_weight_table.py tests/cartesian/test_fused_double_backward.py tests/cartesian/test_linear_pairs.py:230" \
    > "$out/tests_defaults.log" 2>&1
  ;;
training)
  # the training step's kernels under the new defaults, both published models side by side (compiled together, profiled in
  # turns; the 2026-12-07 lease's 140 s per process did not cover the compile), about 5 minutes
  for m in i2c3f20l2r i3c3f64l2; do
    timeout 290 python3 benchmarks/kernel_profile.py --device cuda --model $m --phases training --compile-mode default --repeat 5 \
      --rows 25 --lock /tmp/profile.lock > "$out/kernels_training_$m.log" 2>&1 &
  done
  wait
  # then the double backward's receiver-pass layouts with static shapes (compiled for sm_90 at 20 channels the training
  # pass holds 252 registers merged, 164 split by output rank: "grouped", which lost at run-time sizes), about 2 minutes
  timeout 150 python3 benchmarks/kernels.py --features 20 64 --out-l-max 3 --backends triton --dbwd fused split grouped \
    --row-sums atomic > "$out/kernels_dbwd_layouts.log" 2>&1
  ;;
dbwdnext)
  # after 2026-12-07 late night (about 9 minutes): i3c3f64l2's training step with the one-launch double backward (the
  # default) against the sender pass, beside what the night's call cut short: the fused double backward's conv-l3
  # parity case (every layout), the Triton .pt2 packages, the compiled model with each opt-in setting
  dbwd_ab i3c3f64l2 520 \
    "tests/cartesian/test_fused_double_backward.py::test_fused_double_backward_parity_on_gpu[conv-l3]:300" \
    "tests/export/test_gpu_export.py -k True:360" \
    "tests/model/test_gpu_model.py::test_compiled_settings_on_gpu:360"
  ;;
defaultsnow)
  # after dbwdnext (about 5 minutes): the force call under the defaults of 2026-12-07 late night (static lists and
  # combined kernels on) against both off, graph_bound side by side with tables; then the profiler itself
  # (reduce-overhead force call, tables): the 1.5 ms target under the new defaults
  bound_ab 240 "ab_now.log" "ab_lists0_combo0.log FLASHCART_STATIC_LIST=0 FLASHCART_COMBO_KERNELS=0"
  table_ab 100 "FLASHCART_STATIC_LIST=1 FLASHCART_COMBO_KERNELS=1" > "$out/profile_now.log" 2>&1  # the defaults, spelled out
  ;;
ab)
  # the force call's settings still untimed, side by side (about 4 minutes with one cold compile): the defaults; the
  # first convolution's backward as the sender walk; the RMS norm's invariants as quadratic forms; static lists (the
  # profiler's unpadded Predictor); inductor's combined kernels; linear-map pairs (one launch for a message map and
  # its skip connection); all five; and the tables at 1024 and 2048 intervals instead of 4096 (1024: as accurate as the
  # float32 MLP, RESULTS 2026-12-05; 5.5 instead of 22 MB for the second interaction, so L2-resident: the table-reading
  # kernels did not speed up with fewer registers or instructions, 2026-12-07). The call is GPU-bound (2026-12-07: 1.515 of 1.533 ms on the GPU alone),
  # so the "gpu" lines decide
  bound_ab 420 "${AB_SETTINGS[@]}"
  ;;
liststests)
  # the next session's first call, after 2026-12-07 evening (about 9.5 minutes): what keeps static lists and combined
  # kernels off, and the Triton .pt2 packages with the pairs. GPU parity side by side: the compiled model with each opt-in setting (norm forms, combined kernels) and
  # with the linear-map pairs off (compiled == eager with training gradients), and the engine's GPU tests (ASE, OpenMM,
  # the simulation engine's padded Predictor) with FLASHCART_STATIC_LIST=1; then the profiler itself on this card,
  # reduce-overhead force call with tables: the defaults, then static lists + combined kernels
  gpu_tests 0 "tests/model/test_gpu_model.py::test_compiled_settings_on_gpu:330" > "$out/tests_settings.log" 2>&1 &
  FLASHCART_STATIC_LIST=1 gpu_tests 0 "tests/integrations/test_gpu.py tests/simulation/test_static_list.py:330" > "$out/tests_lists.log" 2>&1 &
  # the Triton-kernel CUDA packages, which now inline the linear-map pairs' kernel (flashcart::lin_pair)
  gpu_tests 0 "tests/export/test_gpu_export.py -k True:330" > "$out/tests_pt2.log" 2>&1 &
  # single maps through grouped_matmul since it gained the pairs' operands (N_FIRST), and the Triton model (pairs on)
  # against the PyTorch model with training gradients
  gpu_tests 0 "tests/cartesian/test_triton_parity.py -k linear_parity:150" "tests/model/test_gpu_model.py::test_triton_model_matches_torch_model_with_training_gradients:150" \
    > "$out/tests_linear.log" 2>&1 &
  wait
  table_ab 100 "FLASHCART_STATIC_LIST=0" "FLASHCART_STATIC_LIST=1 FLASHCART_COMBO_KERNELS=1" > "$out/profile_ab.log" 2>&1
  ;;
abtests)
  # 2026-12-07 evening, one call (about 9 minutes): part ab again with --barrier and 9 rounds (the first try timed beside
  # other processes' first calls), then part defaults' two test groups side by side (GPU parity only, nothing timed)
  BOUND_ROUNDS=9 bound_ab 280 "${AB_SETTINGS[@]}"
  gpu_tests 0 "tests/model/test_gpu_model.py::test_radial_tables_on_gpu_compiled_and_eager tests/model/test_gpu_model.py::test_static_lists_in_reduce_overhead_calls tests/model/test_gpu_model.py::test_compiled_settings_on_gpu:290" \
    > "$out/tests_defaults_model.log" 2>&1 &
  gpu_tests 0 "tests/cartesian/test_weight_table.py tests/cartesian/test_fused_double_backward.py tests/cartesian/test_linear_pairs.py:290" \
    > "$out/tests_defaults_cartesian.log" 2>&1 &
  wait
  ;;
walk)
  # 2026-12-07 (about 9.5 minutes): graph_bound with tables, unpadded as the profiler runs it (its "pipelined" line is the
  # profiler's s/run): static lists 0 (cold compile), static lists 1, then the first convolution's backward as the sender
  # walk (FLASHCART_SENDER_WALK_BACKWARD=1, instead of 158,000 one-edge programs) without and with static lists; then the
  # sender walk's GPU parity (float64, 1e-12: against the per-edge kernel, plain weights, rows, tables, slopes). With
  # WALK_PROFILE=1 (an H200) the profiler's reduce-overhead call with tables comes first.
  [ -n "$WALK_PROFILE" ] && profile_run S reduce-overhead inference 170 profile_radial_table=4096 > "$out/profile_compiled.log" 2>&1
  FLASHCART_STATIC_LIST=0 bound_s 170 bound_static0.log --rounds 5
  FLASHCART_STATIC_LIST=1 bound_s 75 bound_static1.log --rounds 5
  FLASHCART_STATIC_LIST=0 FLASHCART_SENDER_WALK_BACKWARD=1 bound_s 100 bound_walk1_static0.log --rounds 5
  FLASHCART_STATIC_LIST=1 FLASHCART_SENDER_WALK_BACKWARD=1 bound_s 70 bound_walk1_static1.log --rounds 5
  gpu_tests 0 "tests/cartesian/test_triton_parity.py::test_sender_walk_without_input_1_gradient_equals_per_edge tests/cartesian/test_weight_table.py tests/cartesian/test_weight_slopes.py -k sender:150" \
    > "$out/tests_walk.log" 2>&1
  ;;
walktests)
  # after part walk (about 5 minutes): the static lists' GPU test (padded, unpadded), the model's GPU tests with the sender
  # walk on (compiled == eager, tables), then the kernel list of the compiled force call with it
  gpu_tests 0 "tests/model/test_gpu_model.py::test_static_lists_in_reduce_overhead_calls:110" > "$out/tests_static.log" 2>&1
  FLASHCART_SENDER_WALK_BACKWARD=1 gpu_tests 0 "tests/model/test_gpu_model.py::test_radial_tables_on_gpu_compiled_and_eager:100" > "$out/tests_model_walk.log" 2>&1
  FLASHCART_SENDER_WALK_BACKWARD=1 timeout 90 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases inference \
    --compile-mode default --repeat 5 --rows 30 --radial-table 4096 > "$out/kernels_walk.log" 2>&1
  ;;
night1)
  # 2026-12-06 night, first call: the host/GPU split's GPU test; graph_bound (tables, unpadded as the profiler) with the
  # norm forms off (with the host's cProfile) and on; padded with static lists (the second call has them off)
  gpu_tests 0 "tests/test_profiler.py::test_host_gpu_split_on_cuda:60" > "$out/tests.log" 2>&1
  FLASHCART_NORM_FORMS=0 bound_s 190 bound_forms0.log --cprofile 20
  FLASHCART_NORM_FORMS=1 bound_s 110 bound_forms1.log
  FLASHCART_STATIC_LIST=1 bound_s 100 bound_pad_static1.log --pad
  ;;
h200night)
  # on an H200 (the issue's machine; the tables' call has not run on one): the profiler's reduce-overhead force call with
  # 4096-interval tables (cold compile), then part night1's graph_bound runs with the kernels cached
  profile_run S reduce-overhead inference 170 profile_radial_table=4096 > "$out/profile_compiled.log" 2>&1
  FLASHCART_NORM_FORMS=0 bound_s 130 bound_forms0.log --cprofile 20
  FLASHCART_NORM_FORMS=1 bound_s 100 bound_forms1.log
  FLASHCART_STATIC_LIST=1 bound_s 90 bound_pad_static1.log --pad
  ;;
night2)
  # second call: the forms' GPU test; the forms' A/B/A tail (0 then 1), the padded call without static lists, the kernels
  gpu_tests 0 "tests/model/test_gpu_model.py::test_compiled_settings_on_gpu[norm-forms]:200" > "$out/tests.log" 2>&1
  for v in 0 1; do
    FLASHCART_NORM_FORMS=$v timeout 80 python3 benchmarks/graph_bound.py --device cuda --model i2c3f20l2r --radial-table 4096
  done > "$out/bound_forms_ab.log" 2>&1
  FLASHCART_STATIC_LIST=0 timeout 90 python3 benchmarks/graph_bound.py --device cuda --model i2c3f20l2r --radial-table 4096 --pad \
    > "$out/bound_pad_static0.log" 2>&1
  timeout 80 python3 benchmarks/graph_bound.py --device cuda --model i2c3f20l2r --radial-table 4096 --skip-guards > "$out/bound_noguards.log" 2>&1
  FLASHCART_NORM_FORMS=1 timeout 90 python3 benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --phases inference \
    --compile-mode default --repeat 5 --rows 80 --radial-table 4096 > "$out/kernels_forms.log" 2>&1
  ;;
slopesquick)
  # part slopes in less device time: the model's GPU test with tables (slopes against autograd, compiled and eager), the
  # expansion's parity and the slope kernels' parity at 20 channels, then the A/B (about 6 minutes)
  CUDA_VISIBLE_DEVICES=0 timeout -s INT -k 20 200 python3 -m pytest -q -m gpu -p no:cacheprovider -p no:logging --tb=short -rfE \
    tests/model/test_gpu_model.py::test_radial_tables_on_gpu_compiled_and_eager tests/cartesian/test_triton_parity.py::test_expansion_parity \
    tests/cartesian/test_weight_slopes.py -k "radial_tables or expansion or (20 and (per or rows)) or unlisted" > "$out/tests.log" 2>&1
  [ "${SLOPES_TESTS_ONLY:-0}" = 1 ] && exit 0
  table_ab 110 FLASHCART_TABLE_SLOPES=1 FLASHCART_TABLE_SLOPES=0 > "$out/profile_slopes.log" 2>&1
  ;;
*)
  echo "unknown part $part (static, static2, walk, walktests, tests, measure, diagnose, check, verify, next, diag, final, aoti, timings, recheck, devlist, last, prebound, pt2, omm, step, verify2, export, pt2energy, morning, evening, pt2dump, final2, pt2check, pt2cells, csrtime, modelgpu, pt2time, trainprofile, fixed, fixeddiamond, fixed2, trainprofile2, fixedprofile, edgeblocks, final3, nextcall, fixedtime, eagerab, fixed64, stepgrads, gemms, prebounddefault, tsdense, linsplit, pairs, csrbwd, csrcheck, afterbwd, wrows, wrows2, rowsfinal, pairsnext, pairstrain, final4, pipeab, final5, nextgpu, linroute, matmulab, nextmatmul, rowsum, rowtrain, splits, final6, nextsplits, owner, trainratio, dbwdnext, defaultsnow, stepgraph, stepgraphtiny, nextstep, profile2, unitab, unittiles, dbwdgroups, verify3, engineneeds, ncu, ncu2, ncu3, pathgroups, splitsauto, splitsautotrain, splitsparity, prefetch, prefetch2, geomdump, eagercache, rowwise, eagernext, eagersync, rmsforms, edges or ddp)"; exit 2
  ;;
esac
for f in "$out"/*.log; do echo "##### $f"; tail -40 "$f"; done
