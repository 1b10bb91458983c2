"""Writing inside a run folder without ever following a link: the folder is opened once as a
descriptor and every name in it is made, opened or renamed relative to that descriptor.

``ups`` often runs as root in a shared runs folder (mode 1777, like /tmp) where any user can
create entries, and on boxes where ``fs.protected_symlinks`` is 0 the kernel follows their links
for root. So ``ups`` keeps its own rules, whatever that setting says (docs/safety.md):

* a runs folder reached through a link is used only when the kernel's rule for sticky
  world-writable folders would allow it: the link is the acting user's or the owner's of the
  folder that holds it (:func:`check_links`);
* a folder ``ups`` writes into is a real folder (opened ``O_NOFOLLOW | O_DIRECTORY``) of the
  acting user's that no one else may write (:func:`open_own_dir`);
* every file and sub-folder is then made relative to that descriptor: ``mkdir`` that fails on
  an existing name where a folder must be new, ``O_NOFOLLOW`` (and ``O_EXCL`` for a temp file),
  renames inside the folder.

A refusal is an :class:`Unsafe` (an OSError, which every writer of a run already handles)
whose message is one line: what, where, whose. Standard library only: every instrumented
process imports it (the Reporter makes ``status/`` and ``stacks/`` through here).
"""

from __future__ import annotations

import errno
import os
import stat
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

DIR_MODE = 0o755
FILE_MODE = 0o644
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


class Unsafe(OSError):
    """A folder or name ``ups`` will not write through; ``str()`` is the one-line reason."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EPERM, message)

    def __str__(self) -> str:
        return str(self.strerror)


def user_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


# -- the runs folder's path ---------------------------------------------------------------------
def check_links(path: str | os.PathLike[str]) -> None:
    """Refuse a path that reaches its folder through a link the kernel's rule for sticky
    world-writable folders (``fs.protected_symlinks=1``) would not follow: a link in such a
    folder is followed only when it is the acting user's or the folder owner's. Checked on
    every component of the absolute path, whatever the box's setting; a missing component ends
    the check (what ``ups`` then makes is its own)."""
    me = os.geteuid()
    parts = os.path.abspath(os.fspath(path)).split(os.sep)[1:]
    cur = os.sep
    for part in parts:
        if not part:
            continue
        here = os.path.join(cur, part)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise Unsafe(f"{here}: cannot check it ({exc.strerror or exc})") from None
        if stat.S_ISLNK(st.st_mode):
            try:
                parent = os.stat(cur)
                target = os.readlink(here)
            except OSError as exc:
                raise Unsafe(f"{here}: cannot check the link ({exc.strerror or exc})") from None
            sticky_shared = parent.st_mode & stat.S_ISVTX and parent.st_mode & stat.S_IWOTH
            if sticky_shared and st.st_uid not in (me, parent.st_uid):
                raise Unsafe(f"{here} is a link of {user_name(st.st_uid)} to {target!r} in a folder anyone can "
                             f"write ({cur}, mode {stat.S_IMODE(parent.st_mode):o}): ups does not follow another "
                             f"user's link there (it is neither yours, {user_name(me)}, nor the folder owner's)")
            cur = os.path.realpath(here)
        else:
            cur = here


def open_root(path: str | os.PathLike[str], *, create: bool = True) -> int:
    """The runs folder as a descriptor, its path checked by :func:`check_links` first; made
    (with its missing parents, ``DIR_MODE``) when ``create``."""
    path = os.fspath(path)
    check_links(path)
    if create:
        try:
            os.makedirs(path, mode=DIR_MODE, exist_ok=True)
        except OSError as exc:
            raise Unsafe(f"cannot create runs folder {path}: {exc.strerror or exc}") from None
        check_links(path)  # what was missing is ours now; a link planted meanwhile is refused
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise Unsafe(f"runs folder {path}: {exc.strerror or exc}") from None


# -- folders ------------------------------------------------------------------------------------
def check_own(st: os.stat_result, where: str) -> None:
    """A folder (or file) ``ups`` writes into: the acting user's, writable by no one else."""
    me = os.geteuid()
    if st.st_uid != me:
        raise Unsafe(f"{where} belongs to {user_name(st.st_uid)}, not to you ({user_name(me)}): "
                     "ups never writes into another user's run")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Unsafe(f"{where} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): anyone could "
                     "plant a link there for ups to write through; ups does not write into it")


def open_own_dir(name: str | os.PathLike[str], where: str, *, dir_fd: int | None = None) -> int:
    """``name`` (relative to ``dir_fd``) as a descriptor: a real folder, never a link, of the
    acting user's that no one else may write; :class:`Unsafe` otherwise (FileNotFoundError
    passes)."""
    try:
        fd = _open_dir(name, where, dir_fd)
    except (FileNotFoundError, Unsafe):
        raise
    except OSError as exc:
        raise Unsafe(f"{where}: {exc.strerror or exc}") from None
    try:
        check_own(os.fstat(fd), where)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_dir(name: str, where: str, *, dir_fd: int, exist_ok: bool = False) -> int:
    """``mkdir`` relative to ``dir_fd`` (``DIR_MODE``, whatever the umask), then the folder
    opened as :func:`open_own_dir` does. ``exist_ok=False``: FileExistsError when the name is
    taken (by anything: a link is never taken for the folder)."""
    try:
        os.mkdir(name, DIR_MODE, dir_fd=dir_fd)
    except FileExistsError:
        if not exist_ok:
            raise
    return open_own_dir(name, where, dir_fd=dir_fd)


def make_dirs(base: str | os.PathLike[str], relative: str, *, dir_fd: int | None = None) -> int:
    """The folder ``relative`` (``a/b``) under ``base`` (a run folder), each missing component
    made and each one opened ``O_NOFOLLOW``: a link anywhere under ``base``, or ``base`` itself
    a link, is refused, never followed. Returns its descriptor. FileNotFoundError when ``base``
    is gone (a vanished run folder is never made again)."""
    base = os.fspath(base)
    where = base
    fd = _open_dir(base, where, dir_fd)
    try:
        for part in [p for p in relative.split("/") if p and p != "."]:
            if part == "..":
                raise Unsafe(f"{base}/{relative}: '..' leaves the folder")
            where = os.path.join(where, part)
            try:
                os.mkdir(part, DIR_MODE, dir_fd=fd)
            except FileExistsError:
                pass
            nxt = _open_dir(part, where, fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_dir(name: str | os.PathLike[str], where: str, dir_fd: int | None) -> int:
    """``name`` opened ``O_NOFOLLOW | O_DIRECTORY``; a link or a file there is :class:`Unsafe`."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Unsafe(f"{where} is {_what(name, dir_fd)}, not a folder: ups never writes through it") from None
        raise


def in_folder(dir_fd: int, name: str) -> str:
    """A path naming ``name`` in the folder open as ``dir_fd`` (``/proc/self/fd/N/name``): for
    a writer that takes a path (``write_atomic``), the folder is the one opened, whatever its
    path names now, and only ``name`` is resolved in it."""
    return f"/proc/self/fd/{dir_fd}/{name}"


def _what(name: str | os.PathLike[str], dir_fd: int | None) -> str:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return "not a folder"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            target = "?"
        return f"a link of {user_name(st.st_uid)} to {target!r}"
    return f"not a folder (a file of {user_name(st.st_uid)})"


# -- files --------------------------------------------------------------------------------------
def check_entry(name: str, where: str, *, dir_fd: int, folder: bool = False) -> bool:
    """An existing name ``ups`` will write: a regular file (or a folder) of the acting user's
    that no one else may write, never a link. False when there is none."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    test = stat.S_ISDIR if folder else stat.S_ISREG
    if not test(st.st_mode):
        raise Unsafe(f"{where} is {_what(name, dir_fd)}, not a {'folder' if folder else 'regular file'}: "
                     "ups never writes through it")
    check_own(st, where)
    return True


def open_append(name: str, *, dir_fd: int | None) -> int:
    """A log, stack or event file relative to ``dir_fd``, opened for appending (made ``FILE_MODE``
    when new): never through a link, never a FIFO or device found under its name."""
    fd = os.open(name, APPEND_FLAGS, FILE_MODE, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{name} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def write_atomic_at(dir_fd: int, name: str, data: bytes, *, write: Callable[[int, Any], int] = os.write) -> None:
    """``name`` in the folder ``dir_fd`` replaced by ``data``: a fresh temp file beside it
    (``O_EXCL | O_NOFOLLOW``), then a rename inside the folder (a rename never follows the link
    it replaces). On failure the temp file is removed and the OSError propagates."""
    tmp = f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(tmp, flags, FILE_MODE, dir_fd=dir_fd)
        except FileExistsError:
            os.unlink(tmp, dir_fd=dir_fd)
            fd = os.open(tmp, flags, FILE_MODE, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
