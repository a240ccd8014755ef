"""What a run measures: per-step metrics, step timing, profiling, model FLOPs."""
