#!/usr/bin/env python3
"""Run a command inside an arm64 root file system on an x86 Linux host, through qemu-user.

    arm64_chroot.py ROOTFS [--bind SRC:DST[:ro]]... -- COMMAND [ARG]...

Every program of the userland (and every program those start: pip's build, gcc, ...) runs
under qemu-aarch64-static through binfmt_misc. The registration is made in a binfmt_misc
instance private to a new user namespace (Linux >= 6.7 mounts one per user namespace), so
nothing changes for the rest of the machine and it is gone when the command ends; on an older
kernel the host's own registration is used (Debian: `apt install binfmt-support
qemu-user-static`). The command also gets its own mount namespace (the binds, /dev, /proc, /sys
of the chroot) and pid namespace. The CPU qemu emulates is QEMU_CPU from the environment
(e.g. cortex-a72, cortex-a76).

Needs root: the user namespace maps every uid and gid to itself (package files belong to
several users), which only a privileged parent may write.
"""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
QEMU = "/usr/bin/qemu-aarch64-static"
# binfmt_misc entry for aarch64 ELF executables (magic and mask of the ELF header: class 64,
# little endian, type EXEC or DYN, machine 183); F: qemu is opened now, so the chroot needs no copy
BINFMT = (r":edgellm-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:"
          r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:" + QEMU + ":F")


def _die(msg: str) -> None:
    print(f"arm64_chroot: {msg}", file=sys.stderr)
    sys.exit(2)


def _enter_user_namespace() -> None:
    """unshare(user + mount) with the identity map of all ids, written by a child that stays in
    the parent namespace (a process cannot map more than its own id from inside)."""
    libc = ctypes.CDLL(None, use_errno=True)
    r, w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        try:
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{parent}/{name}", "w") as f:
                    f.write("0 0 4294967295\n")
        except OSError as e:
            print(f"arm64_chroot: cannot write the id maps: {e}", file=sys.stderr)
            os._exit(1)
        os._exit(0)
    os.close(r)
    ok = libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0
    err = ctypes.get_errno()
    os.write(w, b"x")
    os.close(w)
    _, status = os.waitpid(pid, 0)
    if not ok:
        _die(f"unshare(user, mount namespaces) failed: {os.strerror(err)}")
    if status != 0:
        _die("the user namespace's id maps could not be written (run as root)")


SETUP = r"""
set -eu
R=$1; BINFMT=$2; BINDS=$3; shift 3
mount --make-rprivate /
if mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null; then
    printf '%s' "$BINFMT" > /proc/sys/fs/binfmt_misc/register
fi
mount --rbind /dev "$R/dev"
mount -t proc proc "$R/proc"
mount --rbind /sys "$R/sys"
for b in $BINDS; do
    src=${b%%:*}; rest=${b#*:}; dst=${rest%%:*}; mode=${rest#"$dst"}
    mkdir -p "$R$dst"
    mount --bind "$src" "$R$dst"
    [ "$mode" = ":ro" ] && mount -o remount,bind,ro "$R$dst"
done
if ! chroot "$R" /bin/true 2>/dev/null; then
    echo "arm64_chroot: aarch64 programs do not run (no private binfmt_misc on this kernel, older than 6.7?," \
         "and no qemu-aarch64 binfmt registration on the host: apt install binfmt-support qemu-user-static)" >&2
    exit 2
fi
exec chroot "$R" "$@"
"""


def main(argv: list[str]) -> None:
    if "--" not in argv or len(argv) < 3:
        _die(__doc__.strip().splitlines()[2].strip())
    sep = argv.index("--")
    opts, cmd = argv[:sep], argv[sep + 1:]
    root, binds = os.path.abspath(opts[0]), []
    rest = opts[1:]
    while rest:
        if rest[0] != "--bind" or len(rest) < 2:
            _die(f"unexpected argument {rest[0]!r}")
        binds.append(rest[1])
        rest = rest[2:]
    if not cmd:
        _die("no command")
    if not sys.platform.startswith("linux"):
        _die("needs Linux")
    if os.geteuid() != 0:
        _die("needs root (the user namespace maps every uid and gid)")
    if not os.access(QEMU, os.X_OK):
        _die(f"{QEMU} is missing (Debian package qemu-user-static)")
    if not os.path.isfile(os.path.join(root, "bin", "true")):
        _die(f"{root} is not a root file system")
    for b in binds:
        if " " in b or b.count(":") not in (1, 2):
            _die(f"--bind {b!r}: expected SRC:DST or SRC:DST:ro, without spaces")
    _enter_user_namespace()
    # a pid namespace of our own (a fresh /proc for the chroot): util-linux unshare forks into it
    os.execvp("unshare", ["unshare", "--pid", "--fork", "--kill-child", "sh", "-c", SETUP, "sh",
                          root, BINFMT, " ".join(binds), *cmd])


if __name__ == "__main__":
    main(sys.argv[1:])
