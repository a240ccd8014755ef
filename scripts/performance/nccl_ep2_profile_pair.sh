#!/usr/bin/env bash
# Profiles steps 4-5 of EP=2 across two GPUs over NCCL with EP overlap off, then on, and analyses
# both traces with analyze_overlap.py (gzipped traces kept for offline gap analysis).
# Usage (repo root, two GPUs, megatron-core importable): bash scripts/performance/nccl_ep2_profile_pair.sh OUT_DIR
set -uo pipefail
out=${1:?results dir}
work=${2:-/tmp/nccl_pair}
mkdir -p "$out" "$work"
py=${PYTHON:-python3}
status=0
for overlap in false true; do
    $py scripts/performance/run_script.py -m qwen -mr qwen3_30b_a3b --task pretrain -g h200 -c bf16 -mb 1 -sl 4096 \
        --cuda_graph_impl none --moe_flex_dispatcher_backend None --tokenizer_type NullTokenizer \
        model.num_layers=4 scheduler.lr_warmup_iters=2 -ng 2 -ep 2 -gb 16 --max_steps 5 \
        --moe_a2a_overlap "$overlap" --profile --profile_step_start 4 --profile_step_end 5 --profile_ranks 0 \
        -l "$work/overlap_$overlap" > "$out/log_overlap_$overlap.txt" 2>&1 || status=1
    trace=$(ls "$work"/overlap_$overlap/profile/trace_rank0_*.json 2>/dev/null | head -1)
    [ -n "$trace" ] || { status=1; continue; }
    $py scripts/performance/analyze_overlap.py "$trace" --ep 2 --json "$out/analysis_overlap_$overlap.json" \
        > "$out/analysis_overlap_$overlap.txt" 2>&1 || status=1
    gzip -c "$trace" > "$out/trace_overlap_$overlap.json.gz"
done
exit $status
