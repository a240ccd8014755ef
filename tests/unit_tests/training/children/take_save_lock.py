"""Take ``checkpoint.save``'s lock at the moment a start file appears, as a run's rank 0 does.

    python take_save_lock.py SAVE_DIR GO_FILE RESULT_FILE [HOLD_S]

Writes ``took`` or ``refused`` into RESULT_FILE, holds a taken lock for HOLD_S seconds (default 1:
a second taker at the same moment must be refused) and exits without releasing it (the next trial
finds a stale lock of a gone process).
"""

import sys
import time
from pathlib import Path

from megatron.bridge.training.loop.save_lock import SaveDirInUseError, SaveDirLock

save_dir, go, result = map(Path, sys.argv[1:4])
hold_s = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
while not go.exists():
    time.sleep(0.0005)
try:
    SaveDirLock(save_dir).acquire()
    result.write_text("took")
    time.sleep(hold_s)
except SaveDirInUseError:
    result.write_text("refused")
