"""Loaded by every Python process of a harness run under test (this directory is put on
``PYTHONPATH``): records each file opened for writing under the audited directories.

    WRITE_AUDIT_ROOTS=DIR[:DIR...]  the run and checkpoint directories
    WRITE_AUDIT_LOG=FILE            one JSON line per write: pid, path, open flags

Python's audit events see every ``open`` and ``os.open`` made from Python, whoever makes it (the
harness, torchrun, the ranks, megatron-core, torch's serialisation).
"""

import json
import os
import sys

_ROOTS = tuple(os.path.realpath(p) + os.sep for p in os.environ.get("WRITE_AUDIT_ROOTS", "").split(os.pathsep) if p)
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _install() -> None:
    log = os.open(os.environ["WRITE_AUDIT_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def hook(event: str, args: tuple) -> None:
        if event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        if not flags & _WRITING:
            return
        path = os.fsdecode(os.path.abspath(args[0]))
        parent = os.path.realpath(os.path.dirname(path))  # the name itself is not followed: it may be a link
        where = os.path.join(parent, os.path.basename(path))
        if where.startswith(_ROOTS):
            os.write(log, (json.dumps({"pid": os.getpid(), "path": where, "flags": flags}) + "\n").encode())

    sys.addaudithook(hook)


if _ROOTS and os.environ.get("WRITE_AUDIT_LOG"):
    _install()
