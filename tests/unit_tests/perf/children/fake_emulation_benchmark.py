"""Stands in for ``scripts/performance/ep_emulation_benchmark.py`` in a checkout made by a test: writes a
results.json whose step is the number in the checkout's ``step.txt`` and notes its run in ``order.log``
beside ``--out``."""

import argparse
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

parser = argparse.ArgumentParser()
parser.add_argument("--out", type=Path)
parser.add_argument("--repeats", type=int)
parser.add_argument("--arms", default="off,on")
args, _ = parser.parse_known_args()
step = float((ROOT / "step.txt").read_text())
args.out.mkdir(parents=True)
with open(args.out.parent / "order.log", "a") as log:
    src_first = os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT / "src")
    log.write(f"{args.out.name} repeats={args.repeats} src_first={src_first}\n")
KEY = {"ep": 16, "layers": 4, "micro_batches": 8, "network": "h100_ib400", "dispatcher": "alltoall"}
rows = [{**KEY, "arm": arm, "step_s": [step * (1.0 if arm == "off" else 0.9)]} for arm in args.arms.split(",")]
(args.out / "results.json").write_text(json.dumps({"device": "1 x GPU", "host": {"cpu": "Example"}, "rows": rows}))
