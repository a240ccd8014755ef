"""The emulated world: one process trains one rank's work of an N-GPU layout.

A torch.distributed backend (:mod:`backend`) plays the other ranks: every collective of every
megatron-core process group returns what a *symmetric* world would give (every rank holds the same
tokens and the same replicated weights; only the experts it owns differ) and takes on the GPU the
time a network model (:mod:`network`) gives it. What the step measures is then this rank's real
compute plus modeled communication, scheduled exactly as megatron-core schedules it: the question
"how much does EP overlap hide on my layout and my network?" on one GPU, or on a CPU for a first
look. Times of collectives are modeled, never measured; the numbers trained are not a real run's.
"""
