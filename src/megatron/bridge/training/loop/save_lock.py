"""One run per checkpoint directory: a locked file in ``checkpoint.save`` for the run's lifetime.

Two jobs saving into one directory would remove each other's staging directories and replace each
other's checkpoints (a published checkpoint could even mix the shards of both). Rank 0 opens
``<checkpoint.save>/run.lock`` before the model is built and holds an exclusive ``flock`` on it
until the run ends; the kernel gives that lock to one process only, and drops it when the process
dies, so taking a free lock and taking over one whose holder is gone are the same atomic act, also
for runs that start at the same moment. The file says who holds it (host, pid, start, run id) so
that a refusal can name the holder. A run on another host that refreshed the file within
``STALE_AFTER_S`` (the holder touches it after every step) is also respected, for file systems
whose locks do not reach across hosts. Reading who holds the lock is a fact validation asks before
launch too (``config_stages/facts/lock_holder.py``, read by ``checkpoint_rules.py``), so the harness
refuses a second job without starting it; this module takes, refreshes and releases it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
import uuid
from pathlib import Path

from megatron.bridge.training.config_stages.facts.lock_holder import (
    LOCK_NAME,
    STARTING,
    LockHolder,
    holder_record,
    lock_problem,
    try_lock,
)
from megatron.bridge.utils.owned_files import check_own_file, make_dir


class SaveDirInUseError(RuntimeError):
    """Another live run holds the checkpoint directory."""


class SaveDirLock:
    """The lock of one run (taken by rank 0 only)."""

    def __init__(self, save_dir: str | os.PathLike) -> None:
        self.path = Path(save_dir) / LOCK_NAME
        self.run_id = uuid.uuid4().hex[:12]
        self.held = False
        self.note: str | None = None
        self._fd: int | None = None

    def acquire(self) -> SaveDirLock:
        """Take the lock; a gone holder's lock is taken over (``note`` says so); a live one raises."""
        make_dir(self.path.parent, parents=True)
        problem = lock_problem(self.path.parent)
        if problem:
            raise SaveDirInUseError(f"checkpoint.save={self.path.parent} cannot be locked: {problem}; remove it")
        fd = self._open_locked()
        previous = holder_record(fd)
        if previous is not None and previous.recent_elsewhere():
            os.close(fd)
            raise self._in_use(previous)
        if previous is not None:
            self.note = f"took over {self.path}: its holder ({previous.describe()}) is no longer running"
        me = dict(host=socket.gethostname(), pid=os.getpid(), started=time.time(), run_id=self.run_id)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)
        self._fd, self.held = fd, True
        return self

    def refresh(self) -> None:
        """Show that the holder is alive (after every step)."""
        if self.held and self._fd is not None:
            try:
                os.utime(self._fd)
            except OSError:  # the lock is a convenience for other runs; never stop training for it
                pass

    def release(self) -> None:
        """Remove the lock file and drop the lock (the file goes first, so nobody takes a removed file)."""
        if not self.held or self._fd is None:
            return
        try:
            if _same_file(self.path, self._fd):
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd, self.held = None, False

    def _open_locked(self) -> int:
        """The lock file, opened and exclusively locked; retried when the holder removed the file
        between the open and the lock (a lock on a removed file holds nothing)."""
        for _ in range(100):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            check_own_file(fd, self.path)
            if not try_lock(fd, fcntl.LOCK_EX):
                holder = holder_record(fd) or STARTING
                os.close(fd)
                raise self._in_use(holder)
            if _same_file(self.path, fd):
                return fd
            os.close(fd)
        raise SaveDirInUseError(f"could not take {self.path}: it was replaced again and again while taking it")

    def _in_use(self, holder: LockHolder) -> SaveDirInUseError:
        return SaveDirInUseError(
            f"checkpoint.save={self.path.parent} is in use by another run ({holder.describe()}): two runs "
            "saving into one directory would replace each other's checkpoints. Wait for it, or give this "
            f"run another checkpoint.save; if that run is gone (a host lost with its lock), delete {self.path}"
        )


def _same_file(path: Path, fd: int) -> bool:
    try:
        on_disk = os.lstat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (mine.st_dev, mine.st_ino)
