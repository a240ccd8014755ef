"""The one way the harness and the ranks write, replace or remove files under a run, checkpoint or
sweep directory.

On a shared cluster other people (and careless scripts) can write into the directories a run uses,
so nothing here opens, truncates or deletes through a name this process did not create:

* a new file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW``: an existing name, link or not, is
  an error, never overwritten;
* a file that is replaced (``summary.json``, the checkpoint tracker) is written under a fresh
  temporary name beside it and renamed over the old name: a rename replaces a link, never follows it;
* a directory is made with ``mkdir`` (which never follows a link); one that already exists must be
  a real directory of this user;
* a removal removes names: a link is unlinked (its target is untouched) and a directory is removed
  with ``shutil.rmtree``'s descriptor-based walk, which never leaves the tree through a link.

:func:`unsafe_entries` lists what a run refuses before it starts: entries that are links or that
belong to another user. Directories above the one a run names are the user's own choice and are
followed as given.
"""

from __future__ import annotations

import errno
import os
import pwd
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

Data = str | bytes
PathLike = str | os.PathLike[str]

_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LISTED = 10
"""How many unsafe entries a refusal names before it says how many more there are."""


class UnsafePathError(OSError):
    """A name the run would write through is a link, another user's, or not what it must be."""

    def __init__(self, path: PathLike, reason: str) -> None:
        super().__init__(errno.EPERM, f"{path} {reason}")
        self.path, self.reason = str(path), reason

    def __str__(self) -> str:
        return f"{self.path} {self.reason}"


def open_new(path: PathLike, mode: str = "w", perms: int = 0o644) -> IO:
    """A new file at ``path``, opened for writing (``"w"`` or ``"wb"``); an existing name is refused."""
    if mode not in ("w", "wb"):
        raise ValueError(f"open_new writes new files only, not mode {mode!r}")
    try:
        fd = os.open(path, _NEW_FLAGS, perms)
    except FileExistsError:
        raise UnsafePathError(path, _existing_reason(path)) from None
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def create_new(path: PathLike, data: Data, perms: int = 0o644) -> None:
    """Write ``data`` into a new file at ``path`` (an existing name, link or not, is refused)."""
    with open_new(path, "wb" if isinstance(data, bytes) else "w", perms) as handle:
        handle.write(data)


def replace_file(path: PathLike, data: Data, *, durable: bool = False, perms: int = 0o644) -> None:
    """Give ``path`` the content ``data`` atomically: a reader sees the old file or the new one, and a
    link at ``path`` is replaced by the file, never written through. ``durable`` syncs file and rename."""
    path = Path(path)
    _refuse_directory(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        with open_new(tmp, "wb" if isinstance(data, bytes) else "w", perms) as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def open_append(path: PathLike) -> IO:
    """``path`` opened to append text: created if missing; a link, another user's file, a file with
    other hard links or anything but a regular file is refused."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(path, "is a symbolic link: the run does not write through it") from None
        raise
    check_own_file(fd, path)
    return os.fdopen(fd, "a", encoding="utf-8", errors="replace")


def check_own_file(fd: int, path: PathLike) -> None:
    """Refuse (closing ``fd``) a file opened with ``O_NOFOLLOW`` that is not a plain file of this user
    with one name: a hard link planted at ``path`` would make a write change another file."""
    reason = _file_reason(os.fstat(fd))
    if reason:
        os.close(fd)
        raise UnsafePathError(path, reason)


def make_dir(path: PathLike, *, parents: bool = False, private: bool = False) -> Path:
    """Make directory ``path`` (its parents too with ``parents``); one that exists must be a real
    directory of this user. ``private``: readable by this user only (for staging directories)."""
    path = Path(path)
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700 if private else 0o777)
    except FileExistsError:
        reason = _dir_reason(os.lstat(path))
        if reason:
            raise UnsafePathError(path, reason) from None
    return path


def make_fresh_dir(path: PathLike, *, private: bool = False) -> Path:
    """Make directory ``path``, which must not exist (a name already there is refused)."""
    path = Path(path)
    try:
        os.mkdir(path, 0o700 if private else 0o777)
    except FileExistsError:
        raise UnsafePathError(path, "already exists: this run creates it and must be the only one using it") from None
    return path


def remove(path: PathLike) -> None:
    """Remove the name ``path``: a file or a link (never its target), or a directory tree that is
    walked without following links. A missing name is not an error."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        _unlink_quietly(path)


def unsafe_entries(directory: PathLike, *, recursive: bool = True) -> list[str]:
    """Entries of ``directory`` a run must not write through: links, and entries of another user
    (``path: why`` each). Not recursing into links; an unreadable subdirectory is one entry."""
    return list(_unsafe(Path(directory), recursive))


def describe_unsafe(found: list[str]) -> str:
    """The first :data:`MAX_LISTED` of ``found``, one per line, then how many more."""
    lines = [f"      {entry}" for entry in found[:MAX_LISTED]]
    if len(found) > MAX_LISTED:
        lines.append(f"      ... and {len(found) - MAX_LISTED} more")
    return "\n".join(lines)


def describe_os_error(exc: OSError, path: PathLike) -> str:
    """One line for a failed write: the reason, and for a full file system how much is left there."""
    if isinstance(exc, UnsafePathError):
        return exc.reason
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        existing = next((p for p in (Path(path), *Path(path).parents) if p.exists()), None)
        if existing is not None:
            reason += f" ({shutil.disk_usage(existing).free / 2**20:.0f} MiB free there)"
    return reason


def fsync_dir(path: PathLike) -> None:
    """Make a rename inside ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------- helpers
def _unsafe(directory: Path, recursive: bool) -> Iterator[str]:
    try:
        entries = list(os.scandir(directory))
    except OSError as exc:
        yield f"{directory}: cannot be listed ({exc.strerror})"
        return
    for entry in entries:
        info = entry.stat(follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            yield f"{entry.path}: a symbolic link (to {_link_target(entry.path)})"
        elif info.st_uid != os.geteuid():
            yield f"{entry.path}: belongs to {_owner(info.st_uid)}, not to you"
        elif recursive and stat.S_ISDIR(info.st_mode):
            yield from _unsafe(Path(entry.path), recursive)


def _existing_reason(path: PathLike) -> str:
    try:
        info = os.lstat(path)
    except OSError:
        return "already exists"
    if stat.S_ISLNK(info.st_mode):
        return f"is a symbolic link (to {_link_target(path)}): the run does not write through it"
    return "already exists: the run writes a new file there and does not overwrite one it did not create"


def _file_reason(info: os.stat_result) -> str | None:
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != os.geteuid():
        return f"belongs to {_owner(info.st_uid)}, not to you"
    if info.st_nlink > 1:
        return "has other hard links: writing it would change another file"
    return None


def _dir_reason(info: os.stat_result) -> str | None:
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link: the run does not write through it"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != os.geteuid():
        return f"belongs to {_owner(info.st_uid)}, not to you"
    return None


def _refuse_directory(path: Path) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        raise UnsafePathError(path, "is a directory, not a file")


def _unlink_quietly(path: PathLike) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _link_target(path: PathLike) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def _owner(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name}"
    except KeyError:
        return f"uid {uid}"
