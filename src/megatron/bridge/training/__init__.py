"""Training-side configuration, validation and the training loop."""
