"""One run per checkpoint directory: a lock file in ``checkpoint.save`` for the run's lifetime.

Two jobs saving into one directory would remove each other's staging directories and replace each
other's checkpoints (a published checkpoint could even mix the shards of both). Rank 0 creates
``<checkpoint.save>/run.lock`` (exclusively) before the model is built and removes it when the run
ends; a second run finds it and stops at once, naming the holder. A lock left by a run that is gone
(same host and its process no longer alive; on another host, a lock its holder has not refreshed
for :data:`STALE_AFTER_S`, since the holder touches it after every step) is taken over, with a note.
Validation reads the same file before launch (``checkpoint_rules.py``), so the harness refuses a
second job without starting it.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

LOCK_NAME = "run.lock"
STALE_AFTER_S = 30 * 60
"""A lock of another host untouched this long belongs to a run that is gone (killed, node lost)."""


class SaveDirInUseError(RuntimeError):
    """Another live run holds the checkpoint directory."""


@dataclass(frozen=True)
class LockHolder:
    host: str
    pid: int
    started: float
    run_id: str
    refreshed: float = 0.0
    """When the holder last touched the lock (the file's modification time)."""

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"host {self.host}, pid {self.pid}, started {when} (run {self.run_id})"

    def alive(self) -> Optional[bool]:
        """Whether the holder still runs (``None``: another host that refreshed the lock recently)."""
        if self.host != socket.gethostname():
            return None if time.time() - self.refreshed < STALE_AFTER_S else False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # a process of another user: alive
            return True
        return True


def read_holder(save_dir: "str | os.PathLike") -> Optional[LockHolder]:
    """The run that holds ``save_dir`` (``None``: nobody; an unreadable lock counts as a gone holder)."""
    path = Path(save_dir) / LOCK_NAME
    try:
        data = json.loads(path.read_text())
        return LockHolder(str(data["host"]), int(data["pid"]), float(data["started"]), str(data["run_id"]),
                          path.stat().st_mtime)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return LockHolder("unknown", -1, 0.0, "unreadable lock file")


def held_by_another_live_run(save_dir: "str | os.PathLike") -> Optional[LockHolder]:
    """The holder of ``save_dir`` when it is another run that is (or may be) alive."""
    holder = read_holder(save_dir)
    if holder is None or holder.pid == os.getpid() and holder.host == socket.gethostname():
        return None
    return None if holder.alive() is False or holder.host == "unknown" else holder


class SaveDirLock:
    """The lock of one run (created by rank 0 only)."""

    def __init__(self, save_dir: "str | os.PathLike") -> None:
        self.path = Path(save_dir) / LOCK_NAME
        self.run_id = uuid.uuid4().hex[:12]
        self.held = False
        self.note: Optional[str] = None

    def acquire(self) -> "SaveDirLock":
        """Take the lock; a gone holder's lock is taken over (``note`` says so); a live one raises."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = dict(host=socket.gethostname(), pid=os.getpid(), started=time.time(), run_id=self.run_id)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = read_holder(self.path.parent)
                if holder is not None and (holder.alive() is not False and holder.host != "unknown"):
                    raise SaveDirInUseError(
                        f"checkpoint.save={self.path.parent} is in use by another run ({holder.describe()}): two "
                        "runs saving into one directory would replace each other's checkpoints. Wait for it, give "
                        f"this run another checkpoint.save, or, if that run is gone, delete {self.path}"
                    ) from None
                self.note = (f"took over {self.path}: its holder ({holder.describe() if holder else 'unknown'}) "
                             "is no longer running")
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as handle:
                json.dump(me, handle)
            self.held = True
            return self
        raise SaveDirInUseError(f"could not take {self.path}: another run took it at the same moment")

    def refresh(self) -> None:
        """Show that the holder is alive (after every step)."""
        if self.held:
            try:
                os.utime(self.path)
            except OSError:  # the lock is a convenience for other runs; never stop training for it
                pass

    def release(self) -> None:
        """Remove the lock if this run still holds it."""
        if not self.held:
            return
        holder = read_holder(self.path.parent)
        if holder is not None and holder.run_id == self.run_id:
            self.path.unlink(missing_ok=True)
        self.held = False
