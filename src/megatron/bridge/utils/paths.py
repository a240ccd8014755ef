"""Whether a directory a run will write into can be used, asked before anything is launched."""

from __future__ import annotations

import os
from pathlib import Path


def writable_directory_problem(path: Path) -> str | None:
    """Why ``path`` cannot be the directory a run writes into (``None``: it can).

    It must be a directory, or not exist yet under a directory this process can create it in and
    write (a read-only mount answers no, also for root).
    """
    if path.exists() and not path.is_dir():
        return "is a file, not a directory"
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        return "cannot be created: no existing directory above it"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot be {'written' if existing == path else 'created'}: {existing} is not writable here"
    return None
