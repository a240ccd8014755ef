"""Runs ``scripts/performance/run_script.py`` as a user does, with the arguments given, and prints on
its last line, as JSON, the exit code, what the harness printed and whether torch and megatron-core
were imported by then.

    harness_imports.py RUN_SCRIPT ARG...
"""

import contextlib
import io
import json
import runpy
import sys

script, *arguments = sys.argv[1:]
sys.argv = [script, *arguments]
printed = io.StringIO()
with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):  # argparse writes to stderr
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code
print(
    json.dumps(
        {
            "exit": code,
            "printed": printed.getvalue(),
            "torch": "torch" in sys.modules,
            "megatron.core": "megatron.core" in sys.modules,
        }
    )
)
