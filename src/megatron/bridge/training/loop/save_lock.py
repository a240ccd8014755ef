"""One run per checkpoint directory: a locked file in ``checkpoint.save`` for the run's lifetime.

Two jobs saving into one directory would remove each other's staging directories and replace each
other's checkpoints (a published checkpoint could even mix the shards of both). Rank 0 opens
``<checkpoint.save>/run.lock`` before the model is built and holds an exclusive ``flock`` on it
until the run ends; the kernel gives that lock to one process only, and drops it when the process
dies, so taking a free lock and taking over one whose holder is gone are the same atomic act, also
for runs that start at the same moment. The file says who holds it (host, pid, start, run id) so
that a refusal can name the holder. A run on another host that refreshed the file within
:data:`STALE_AFTER_S` (the holder touches it after every step) is also respected, for file systems
whose locks do not reach across hosts. Validation asks the same questions before launch
(``checkpoint_rules.py``), so the harness refuses a second job without starting it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from megatron.bridge.utils.owned_files import check_own_file, make_dir

LOCK_NAME = "run.lock"
STALE_AFTER_S = 30 * 60
"""A lock of another host untouched this long belongs to a run that is gone (killed, node lost)."""
MAX_LOCK_BYTES = 4096
"""A holder record is a few hundred bytes; more is not a record this code wrote."""


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
        if self.pid < 0:
            return "a run that is starting (its lock is taken, its record not yet written)"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"host {self.host}, pid {self.pid}, started {when} (run {self.run_id})"

    def recent_elsewhere(self) -> bool:
        """A holder on another host that refreshed the lock recently: alive as far as can be told."""
        return self.host != socket.gethostname() and time.time() - self.refreshed < STALE_AFTER_S


STARTING = LockHolder("?", -1, 0.0, "?")


def lock_problem(save_dir: "str | os.PathLike") -> Optional[str]:
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


def read_holder(save_dir: "str | os.PathLike") -> Optional[LockHolder]:
    """Who the lock file says holds ``save_dir`` (``None``: no lock file, or an empty one)."""
    path = Path(save_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return _record(fd)
    finally:
        os.close(fd)


def held_by_another_live_run(save_dir: "str | os.PathLike") -> Optional[LockHolder]:
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
        holder = _record(fd)
        if not _try_lock(fd, fcntl.LOCK_SH):
            return holder or STARTING
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    return holder if holder is not None and holder.recent_elsewhere() else None


class SaveDirLock:
    """The lock of one run (taken by rank 0 only)."""

    def __init__(self, save_dir: "str | os.PathLike") -> None:
        self.path = Path(save_dir) / LOCK_NAME
        self.run_id = uuid.uuid4().hex[:12]
        self.held = False
        self.note: Optional[str] = None
        self._fd: Optional[int] = None

    def acquire(self) -> "SaveDirLock":
        """Take the lock; a gone holder's lock is taken over (``note`` says so); a live one raises."""
        make_dir(self.path.parent, parents=True)
        problem = lock_problem(self.path.parent)
        if problem:
            raise SaveDirInUseError(f"checkpoint.save={self.path.parent} cannot be locked: {problem}; remove it")
        fd = self._open_locked()
        previous = _record(fd)
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
            if not _try_lock(fd, fcntl.LOCK_EX):
                holder = _record(fd) or STARTING
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


def _try_lock(fd: int, kind: int) -> bool:
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


def _same_file(path: Path, fd: int) -> bool:
    try:
        on_disk = os.lstat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (mine.st_dev, mine.st_ino)


def _record(fd: int) -> Optional[LockHolder]:
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
        return LockHolder(str(data["host"]), int(data["pid"]), float(data["started"]), str(data["run_id"]),
                          os.fstat(fd).st_mtime)
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return LockHolder("unknown", 0, 0.0, "unreadable lock file")
