"""Small real filesystems for fault tests: a size-limited tmpfs, and ext4 on a loop device.

Both need root (mount). Where mounting is impossible (not root, no loop devices, no mkfs.ext4,
a container without CAP_SYS_ADMIN) the context managers raise `Unmountable` with the reason, and
the tests fall back to an injected OSError at the appender's write call.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

# ioctl(EXT4_IOC_SHUTDOWN) = _IOR('X', 125, __u32); NOLOGFLUSH stops the filesystem at once, and
# every later write, sync or truncate on it fails with EIO, as after a dying disk.
EXT4_IOC_SHUTDOWN = 0x8004587D
EXT4_GOING_FLAGS_NOLOGFLUSH = 0x2


class Unmountable(Exception):
    """This machine cannot mount the filesystem a test wants; the message says why."""


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _umount(where: Path) -> None:
    done = _run("umount", str(where))
    if done.returncode != 0:
        # Something in the test still holds a file open; lazy so the suite can go on.
        _run("umount", "-l", str(where))


@contextlib.contextmanager
def small_tmpfs(where: Path, size: int) -> Iterator[Path]:
    """A tmpfs of `size` bytes mounted on `where` (created); unmounted afterwards."""
    if os.geteuid() != 0:
        raise Unmountable("mounting needs root")
    where.mkdir(parents=True, exist_ok=True)
    done = _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where))
    if done.returncode != 0:
        raise Unmountable(f"mount -t tmpfs failed: {done.stderr.strip() or done.returncode}")
    try:
        yield where
    finally:
        _umount(where)


@contextlib.contextmanager
def ext4_loop(image: Path, where: Path, size: int = 32 << 20) -> Iterator[Path]:
    """ext4 in `image` (a file of `size` bytes), loop-mounted on `where` with errors=remount-ro."""
    if os.geteuid() != 0:
        raise Unmountable("mounting needs root")
    if shutil.which("mkfs.ext4") is None:
        raise Unmountable("mkfs.ext4 is not installed (e2fsprogs)")
    if not Path("/dev/loop-control").exists():
        raise Unmountable("no loop devices on this machine (/dev/loop-control)")
    with open(image, "wb") as fh:
        fh.truncate(size)
    made = _run("mkfs.ext4", "-q", "-F", str(image))
    if made.returncode != 0:
        raise Unmountable(f"mkfs.ext4 failed: {made.stderr.strip()}")
    where.mkdir(parents=True, exist_ok=True)
    mount_ext4(image, where)
    try:
        yield where
    finally:
        _umount(where)


def mount_ext4(image: Path, where: Path) -> None:
    done = _run("mount", "-o", "loop,errors=remount-ro", str(image), str(where))
    if done.returncode != 0:
        raise Unmountable(f"mount -o loop failed: {done.stderr.strip() or done.returncode}")


def umount(where: Path) -> None:
    _umount(where)


def emergency_read_only(where: Path) -> None:
    """What ext4 does on a disk error with errors=remount-ro: the filesystem turns read-only at
    once, open files included (a plain `mount -o remount,ro` is refused while files are open for
    writing). The `abort` mount option stages exactly that kernel path."""
    done = _run("mount", "-o", "remount,abort", str(where))
    if done.returncode != 0:
        raise Unmountable(f"mount -o remount,abort failed: {done.stderr.strip()}")


def plain_remount_read_only(where: Path) -> subprocess.CompletedProcess[str]:
    return _run("mount", "-o", "remount,ro", str(where))


def shut_down(where: Path) -> None:
    """Stop an ext4 filesystem as a failing disk would: later I/O on it fails with EIO."""
    fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
    except OSError as exc:
        raise Unmountable(f"EXT4_IOC_SHUTDOWN failed: {exc}") from None
    finally:
        os.close(fd)
