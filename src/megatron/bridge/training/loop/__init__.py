"""The training loop: building, data, checkpoints, steps, stop requests, teardown, what a run says about itself."""
