"""A stand-in for one training rank: prints an iteration line every 50 ms.

    fake_rank.py RANK MODE MARKER_DIR

``graceful``: SIGTERM is recorded; the rank finishes its "step", writes ``MARKER_DIR/rank<N>.stopped``
(holding how many SIGTERMs it saw) and ``MARKER_DIR/rank<N>.reason`` (the signal it reports the stop
under, as a real rank does: ``stop_request.reported_signal``) and exits 0. ``saved``: as ``graceful``,
but after its "save" it writes ``summary.json`` into the supervisor's log directory of the tests
(``MARKER_DIR/../log``) and then takes its time to exit (until it is killed). ``stubborn`` and
``orphan``: SIGTERM is ignored and the rank runs until it is killed. ``slow``: silent for 1.2 s, then
three iterations and exit 0. Every rank writes its pid to ``MARKER_DIR/rank<N>.pid``.
"""

import os
import signal
import sys
import time
from pathlib import Path

from megatron.bridge.training.loop.stop_request import reported_signal

rank, mode, markers = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
terms = []
if mode in ("graceful", "saved"):
    signal.signal(signal.SIGTERM, lambda signum, frame: terms.append(reported_signal(signum)))
else:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
(markers / f"rank{rank}.pid").write_text(str(os.getpid()))
if mode == "slow":
    time.sleep(1.2)
    for iteration in range(1, 4):
        print(f"[default{rank}]:iteration {iteration}", flush=True)
    sys.exit(0)
iteration = 0
while not terms:
    iteration += 1
    print(f"[default{rank}]:iteration {iteration}", flush=True)
    time.sleep(0.05)
time.sleep(0.2)  # "finish the step"; a second SIGTERM in the meantime is counted too
(markers / f"rank{rank}.stopped").write_text(str(len(terms)))
(markers / f"rank{rank}.reason").write_text(signal.Signals(terms[0]).name)
if mode == "saved":
    if rank == 0:
        (markers.parent / "log" / "summary.json").write_text(f'{{"final_iteration": {iteration}}}')
    print(f"[default{rank}]:summary written", flush=True)
    time.sleep(60)  # a slow exit: the test's second signal kills it
sys.exit(0)
