#!/usr/bin/env bash
# GPU acceptance through the perf harness on ONE GPU (issues 4 and 5):
#   1. Qwen3-30B-A3B-width proxy (4 layers, seq 4096, MBS 1, GBS 8 = 8 micro-batches), EP=1, 10 steps;
#   2. one-knob sweep of EP overlap (false,true) with EP=2 as two processes on the one GPU over gloo;
#   3. a profile of steps 4-5 with EP overlap on, analysed by analyze_overlap.py.
# On one H200 the gloo EP=2 steps take ~21 s (all-to-all and DP all-reduce through host memory):
# stage 2 needs ~7.5 minutes and stage 3 ~3; give each its own device call
# (SKIP_EP1=1 SKIP_PROFILE=1 for the sweep, SKIP_EP1=1 SKIP_SWEEP=1 for the profile).
# With NCCL_EP2=1 on a machine with two GPUs, stage 4 repeats the sweep and the profile with EP=2 as one
# process per GPU over NCCL (GBS 16: 8 micro-batches per rank), which is what overlap is for.
# Usage (repo root, megatron-core importable, e.g. PYTHONPATH=/tmp/site:src):
#   bash scripts/performance/gpu_acceptance_harness.sh RESULTS_DIR [WORK_DIR]
# RESULTS_DIR receives a flat copy of the summaries, sweep.md/png, the analysis and the log.
set -uo pipefail
results=${1:?results dir}
work=${2:-/tmp/gpu_acceptance}
mkdir -p "$results" "$work"
py=${PYTHON:-python3}
common=(-m qwen -mr qwen3_30b_a3b --task pretrain -g h200 -c bf16 -mb 1 -sl 4096
        --cuda_graph_impl none --moe_flex_dispatcher_backend None --tokenizer_type NullTokenizer
        model.num_layers=4 scheduler.lr_warmup_iters=2)
# Extra dotted overrides for the 2-ranks-on-1-GPU gloo runs (e.g. optimizer settings), space separated.
read -r -a ep2_extra <<< "${EP2_OVERRIDES:-}"
status=0
# Results are copied right after each stage, so a run cut short by a time limit keeps what finished.
# collect_sweep NAME: $work/NAME/sweep.{md,png} -> NAME.{md,png}, each value's summary -> NAME_<value>_summary.json
collect_sweep() {
    cp "$work/$1/sweep.md" "$results/$1.md" 2>/dev/null
    cp "$work/$1/sweep.png" "$results/$1.png" 2>/dev/null
    for d in "$work/$1"/*/; do
        [ -d "$d" ] || continue
        name=$(basename "$d" | tr -c 'A-Za-z0-9._\n-' '_')
        cp "$d/summary.json" "$results/$1_${name}_summary.json" 2>/dev/null
    done
}
# analyze_profile RUN PREFIX: rank 0's trace of $work/RUN -> PREFIXoverlap_analysis.{json,txt}
analyze_profile() {
    trace=$(ls "$work/$1"/profile/trace_rank0_*.json 2>/dev/null | head -1)
    [ -n "$trace" ] || return 0
    $py scripts/performance/analyze_overlap.py "$trace" --ep 2 --json "$results/$2overlap_analysis.json" \
        | tee "$results/$2overlap_analysis.txt" || status=1
}
if [ -z "${SKIP_EP1:-}" ]; then
echo "### 1. EP=1 proxy"
$py scripts/performance/run_script.py "${common[@]}" -ng 1 -ep 1 -gb 8 --max_steps 10 -l "$work/ep1" || status=1
cp "$work/ep1/summary.json" "$results/ep1_summary.json" 2>/dev/null
fi
if [ -z "${SKIP_SWEEP:-}" ]; then
echo "### 2. EP=2 (2 ranks on 1 GPU, gloo) sweep of EP overlap"
$py scripts/performance/run_script.py "${common[@]}" "${ep2_extra[@]}" -ng 1 --procs_per_gpu 2 -ep 2 -gb 8 --max_steps 8 \
    -l "$work/sweep" --sweep comm_overlap.overlap_moe_expert_parallel_comm=false,true || status=1
collect_sweep sweep
fi
if [ -n "${NCCL_EP2:-}" ]; then
echo "### 4. EP=2 across two GPUs over NCCL: sweep of EP overlap, then a profile with it on"
$py scripts/performance/run_script.py "${common[@]}" -ng 2 -ep 2 -gb 16 --max_steps 10 \
    -l "$work/nccl_sweep" --sweep comm_overlap.overlap_moe_expert_parallel_comm=false,true || status=1
collect_sweep nccl_sweep
$py scripts/performance/run_script.py "${common[@]}" -ng 2 -ep 2 -gb 16 --max_steps 6 \
    --moe_a2a_overlap true --profile --profile_step_start 4 --profile_step_end 5 --profile_ranks 0 \
    -l "$work/nccl_profile" || status=1
analyze_profile nccl_profile nccl_
fi
[ -n "${SKIP_PROFILE:-}" ] && exit $status
echo "### 3. profile, EP overlap on"
$py scripts/performance/run_script.py "${common[@]}" "${ep2_extra[@]}" -ng 1 --procs_per_gpu 2 -ep 2 -gb 8 --max_steps 5 \
    --moe_a2a_overlap true --profile --profile_step_start 4 --profile_step_end 5 --profile_ranks 0 \
    -l "$work/profile" || status=1
analyze_profile profile ""
exit $status
