"""Stage 5: the one resolution of a config (finalize), the overlap report, upstream's lifecycle calls and the
generated overlap docs."""
