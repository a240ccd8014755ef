"""Test-wide settings: quiet megatron-core's import-time warnings about missing TE/Apex."""

import os
import warnings

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
warnings.filterwarnings("ignore", message=".*Transformer Engine.*")
warnings.filterwarnings("ignore", message=".*absl.logging.*")
