"""A plain Python session (a user's own script): imports the package, then logs every known
megatron-core notice (``utils.quiet.KNOWN_LOG_RECORDS``) from its logger, and the same texts from
a logger of the user's, with no logging configured (Python's last-resort handler prints to stderr)."""

import logging

import megatron.bridge  # noqa: F401  (what every script does first, through a recipe or pretrain)
from megatron.bridge.utils.quiet import KNOWN_LOG_RECORDS

for name, text in KNOWN_LOG_RECORDS:
    logging.getLogger(name).warning("%s (from megatron-core)", text)
    logging.getLogger("my_training_script").warning("%s (from the user)", text)
