"""Who holds a checkpoint directory: its lock file read from disk, without taking the lock.

A run holds ``<checkpoint.save>/run.lock`` for its lifetime (an exclusive ``flock`` plus a record of
host, pid, start and run id; ``training/loop/save_lock.py`` takes and releases it). Validation asks
the questions here before launch (``checkpoint_rules.py``): is the file usable as a lock, and does
another run that is (or may be) alive hold it. A run on another host that refreshed the file within
:data:`STALE_AFTER_S` counts as alive, for file systems whose locks do not reach across hosts.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

LOCK_NAME = "run.lock"
STALE_AFTER_S = 30 * 60
"""A lock of another host untouched this long belongs to a run that is gone (killed, node lost)."""
MAX_LOCK_BYTES = 4096
"""A holder record is a few hundred bytes; more is not a record this code wrote."""


@dataclass(frozen=True)
class LockHolder:
    host: str
    pid: int
    started: float
    run_id: str
    refreshed: float = 0.0
    """When the holder last touched the lock (the file's modification time)."""

    def describe(self) -> str:
        if self.pid < 0:
            return "a run that is starting (its lock is taken, its record not yet written)"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"host {self.host}, pid {self.pid}, started {when} (run {self.run_id})"

    def recent_elsewhere(self) -> bool:
        """A holder on another host that refreshed the lock recently: alive as far as can be told."""
        return self.host != socket.gethostname() and time.time() - self.refreshed < STALE_AFTER_S


STARTING = LockHolder("?", -1, 0.0, "?")


def lock_problem(save_dir: str | os.PathLike) -> str | None:
    """Why ``<save_dir>/run.lock`` cannot be a lock (a directory, a link, another user's file);
    ``None`` when it is missing or a plain file of this user."""
    path = Path(save_dir) / LOCK_NAME
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symbolic link, not a lock file this tool wrote"
    if not stat.S_ISREG(info.st_mode):
        return f"{path} is not a regular file (a directory?), so it cannot be the run's lock"
    if info.st_uid != os.geteuid():
        return f"{path} belongs to another user"
    return None


def read_holder(save_dir: str | os.PathLike) -> LockHolder | None:
    """Who the lock file says holds ``save_dir`` (``None``: no lock file, or an empty one)."""
    path = Path(save_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return holder_record(fd)
    finally:
        os.close(fd)


def held_by_another_live_run(save_dir: str | os.PathLike) -> LockHolder | None:
    """The holder of ``save_dir`` when it is another run that is (or may be) alive: one that holds the
    file's lock, or a recent holder on another host."""
    path = Path(save_dir) / LOCK_NAME
    if lock_problem(save_dir) is not None:
        return None  # refused by its own rule
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        holder = holder_record(fd)
        if not try_lock(fd, fcntl.LOCK_SH):
            return holder or STARTING
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    return holder if holder is not None and holder.recent_elsewhere() else None


def try_lock(fd: int, kind: int) -> bool:
    """``flock`` without waiting: ``False`` when another process holds it. A file system without
    ``flock`` counts as unlocked (the record and its refresh time still protect across hosts)."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return True
        raise
    return True


def holder_record(fd: int) -> LockHolder | None:
    """The holder record in the open lock file; ``None`` for an empty file; an unreadable record is
    a holder of unknown identity."""
    try:
        raw = os.pread(fd, MAX_LOCK_BYTES + 1, 0)
    except OSError:
        return LockHolder("unknown", 0, 0.0, "unreadable lock file")
    if not raw.strip():
        return None
    try:
        data = json.loads(raw.decode())
        return LockHolder(
            str(data["host"]), int(data["pid"]), float(data["started"]), str(data["run_id"]), os.fstat(fd).st_mtime
        )
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return LockHolder("unknown", 0, 0.0, "unreadable lock file")
