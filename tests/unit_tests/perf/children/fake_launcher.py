"""A stand-in for torchrun/srun: starts ``N`` fake ranks in their own sessions (as torchrun does),
waits for them and exits 0 when all did (1 otherwise).

    fake_launcher.py N MODE MARKER_DIR

MODE is passed to every rank (see ``fake_rank.py``); with ``orphan`` the launcher itself exits
after 1.5 s and leaves its ranks running. The launcher writes its pid to ``MARKER_DIR/launcher.pid``;
a SIGTERM it receives is noted in ``MARKER_DIR/launcher.term`` and passed on to every rank (as srun
does).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

count, mode, markers = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
here = Path(__file__).parent


def on_term(signum, frame):
    (markers / "launcher.term").write_text("SIGTERM")
    for rank in ranks:
        rank.send_signal(signal.SIGTERM)


ranks: list = []
signal.signal(signal.SIGTERM, on_term)
(markers / "launcher.pid").write_text(str(os.getpid()))
ranks += [
    subprocess.Popen(
        [sys.executable, str(here / "fake_rank.py"), str(rank), mode, str(markers)], start_new_session=True
    )
    for rank in range(count)
]
print("launcher: started", count, "ranks", flush=True)
if mode == "orphan":
    time.sleep(1.5)
    sys.exit(0)
codes = [rank.wait() for rank in ranks]
print("launcher: rank exit codes", codes, flush=True)
sys.exit(0 if all(code == 0 for code in codes) else 1)
