"""The run directory: made by this harness, marked as its own, used by one harness at a time.

A run directory holds what the harness writes before launch (``config.yaml``, the batch script),
what it writes while the job runs (``launch.log``) and what the ranks write (``summary.json``,
``failures/``, ``torchrun/``, ``profile/``). A re-run in the same directory replaces and deletes
some of those, so the harness only uses a directory that is its own: one it created and marked
with :data:`MARKER`, or an empty directory of this user, which it marks. Anything else (``-l ~``,
``-l ""`` from an unset variable, another tool's directory) is refused before launch, as is a run
directory holding links or other users' entries. A run directory without ``-l`` gets a new name
for every run and is created exclusively, so two runs started in the same second never share one.

The marker is also the lock: the harness holds an exclusive ``flock`` on it while it runs, so a
second harness naming the same directory is refused, naming the first.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from megatron.bridge.utils.owned_files import (
    UnsafePathError,
    check_own_file,
    describe_unsafe,
    make_dir,
    open_new,
    remove,
    unsafe_entries,
)
from megatron.bridge.utils.paths import writable_directory_problem

MARKER = ".megatron-bridge-run"
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096
MIN_FREE_BYTES = 16 * 2**20
"""Free space a run directory's file system needs at launch: config, logs, per-rank copies, summary
(a profile trace needs more; a full disk mid-run is said in one line by whoever fails to write)."""
LEFT_BY_AN_EARLIER_RUN = ("summary.json", "launch.log", "failures")
"""What a re-run removes first, so that its report never reads an earlier run's results."""


@dataclass
class RunDirClaim:
    """This harness's hold on its run directory (released when the harness exits)."""

    path: Path
    fd: int

    def still_there(self) -> bool:
        """Whether the directory and its marker are the ones claimed (not removed during the run)."""
        try:
            on_disk = os.lstat(self.path / MARKER)
        except OSError:
            return False
        mine = os.fstat(self.fd)
        return (on_disk.st_dev, on_disk.st_ino) == (mine.st_dev, mine.st_ino)

    def release(self) -> None:
        os.close(self.fd)


class RunDirError(Exception):
    """The run directory cannot be used (the message names it and says why)."""


def path_length_problem(field: str, text: str) -> str | None:
    """A path the file system would refuse for its length, named before anything is written."""
    raw = os.fsencode(text)
    if len(raw) > MAX_PATH_BYTES:
        return f"{field}: the path is {len(raw)} bytes long; file systems take at most {MAX_PATH_BYTES}"
    long = next((part for part in raw.split(b"/") if len(part) > MAX_NAME_BYTES), None)
    if long is not None:
        return (
            f"{field}: the name {os.fsdecode(long[:40])}... is {len(long)} bytes long; a file name "
            f"holds at most {MAX_NAME_BYTES}"
        )
    return None


def run_dir_problems(path: Path) -> list[str]:
    """Why ``path`` cannot be this run's directory (empty: it can); nothing is created or changed."""
    length = path_length_problem("-l/logger.log_dir", str(path))
    if length:
        return [length]
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        problem = writable_directory_problem(path)
        return [f"-l/logger.log_dir {str(path)!r} {problem}"] if problem else _space_problems(path)
    except OSError as exc:
        return [f"-l/logger.log_dir {str(path)!r} cannot be read: {exc.strerror}"]
    return _existing_dir_problems(path, info) or _space_problems(path)


def claim(path: Path) -> RunDirClaim:
    """Make ``path`` this harness's run directory (create and mark it, or take an existing own or
    empty one), lock it, and remove what an earlier run there left that this run's report would
    misread. Raises :class:`RunDirError` with the reason."""
    try:
        fresh = _make(path)
        if not fresh:
            problems = _existing_dir_problems(path, os.lstat(path))
            if problems:
                raise RunDirError("; ".join(problems))
        held = _lock_marker(path)
        for name in LEFT_BY_AN_EARLIER_RUN:
            remove(path / name)
        return held
    except UnsafePathError as exc:
        raise RunDirError(str(exc)) from None
    except OSError as exc:
        raise RunDirError(f"{path} cannot be used as the run directory: {exc.strerror or exc}") from None


def make_child_dir(parent: Path, name: str) -> Path:
    """A directory the ranks write into (``failures/``, ``torchrun/``): a real one of this user."""
    return make_dir(parent / name)


# --------------------------------------------------------------------------------------------- helpers
def _existing_dir_problems(path: Path, info: os.stat_result) -> list[str]:
    where = f"-l/logger.log_dir {str(path)!r}"
    if not os.path.isdir(path):
        return [f"{where} is a file, not a directory"]
    if info.st_uid != os.geteuid():
        return [f"{where} belongs to another user: a run writes only into its own directories"]
    try:
        names = set(os.listdir(path))
    except OSError as exc:
        return [f"{where} cannot be listed: {exc.strerror}"]
    if names and MARKER not in names:
        return [
            f"{where} already exists and is not a run directory of this harness (no {MARKER} in it): "
            "a run there would replace config.yaml and delete summary.json, launch.log and failures/; "
            "choose a new or empty directory (or leave out -l: every run gets its own)"
        ]
    problems = []
    found = unsafe_entries(path)
    if found:
        problems.append(
            f"{where} holds entries a run must not write through (links, or another user's):\n"
            f"{describe_unsafe(found)}\n    remove them, or choose another run directory"
        )
    holder = _holder(path) if MARKER in names else None
    if holder:
        problems.append(
            f"{where} is in use by another harness ({holder}): two runs in one directory would "
            "overwrite each other's config and results; wait for it or choose another directory"
        )
    return problems


def _space_problems(path: Path) -> list[str]:
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    free = shutil.disk_usage(existing).free if existing is not None else MIN_FREE_BYTES
    if free >= MIN_FREE_BYTES:
        return []
    return [
        f"-l/logger.log_dir {str(path)!r}: its file system has {free / 2**20:.1f} MiB free (No space left "
        f"for a run: it needs {MIN_FREE_BYTES // 2**20} MiB for its config, logs and results); free some space "
        "or choose a directory on another file system"
    ]


def _make(path: Path) -> bool:
    """Create ``path`` (its parents too); ``True`` when this call created it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path)
    except FileExistsError:
        return False
    return True


def _lock_marker(path: Path) -> RunDirClaim:
    marker = path / MARKER
    try:
        open_new(marker).close()
    except UnsafePathError:
        if marker.is_symlink() or not marker.is_file():
            raise
    fd = os.open(marker, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    check_own_file(fd, marker)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        raise RunDirError(
            f"{path} is in use by another harness ({holder or 'starting'}); wait for it or choose another run directory"
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"harness pid {os.getpid()}".encode(), 0)
    return RunDirClaim(path, fd)


def _holder(path: Path) -> str | None:
    """Who holds ``path``'s marker lock (``None``: nobody)."""
    try:
        fd = os.open(path / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read(fd) or "starting"
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        return ""
