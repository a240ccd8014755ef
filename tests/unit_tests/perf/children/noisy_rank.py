"""A stand-in for one training rank that prints what a real one prints while it starts: the known
third-party noise of ``megatron.bridge.utils.quiet`` (an import-time warning, megatron-core's INFO
dump over several lines, a known record, torch's "No CUDA runtime" record) between its own lines.

    noisy_rank.py [--verbose]

Logging is set up by the entry point's own ``configure_logging`` (rank 0; ``--verbose`` as the entry
point's flag), so the flag and the environment decide, as in a real rank, whether the noise is
dropped, printed marked or printed as it is.
"""

import logging
import sys
import warnings

from megatron.bridge.utils.quiet import configure_logging

configure_logging(verbose="--verbose" in sys.argv[1:], rank="0", main_rank=True)
print("[megatron.bridge] launch: stand-in rank", flush=True)
warnings.warn("Apex is not installed. Falling back to Torch Norm", UserWarning)
logging.getLogger("megatron.core.distributed.param_and_grad_buffer").info(
    "Number of buckets: 1\nParams for bucket 1 (2 elements):\n\tmodule.weight"
)
logging.getLogger("megatron.core.models.gpt.gpt_model").warning("GPTModel IS DEPRECATED. Use the hybrid model.")
logging.getLogger("torch.utils.cpp_extension").warning("No CUDA runtime is found, using CUDA_HOME='/usr/local'")
warnings.warn("an unknown warning the user must see", UserWarning)
logging.getLogger("megatron.core.optimizer").warning("a megatron-core warning the user must see")
print("iteration      1/1 | loss 1.0", flush=True)
sys.stderr.flush()
