"""The `unshare` backend's sandbox: new user, mount, network, PID, IPC, UTS and cgroup namespaces
built with util-linux alone (`unshare`, `mount`, `pivot_root`, `setpriv`), for machines without
bubblewrap or a Docker engine.

What one run gets (`Isolation.UNSHARE`, used by `sandboxes.local.LocalSandbox`):
- its own user namespace with a fresh mapping: uid/gid 0 inside is the unprivileged sandbox uid
  outside (65534 when the host runs as root, the host user otherwise);
- a network namespace holding only a loopback that is down: nothing is reachable, the host's
  127.0.0.1 (a Ray head's dashboard and Jobs API included) and its abstract unix sockets too;
- a new root: a tmpfs holding read-only binds of /usr (and the /bin, /lib... links), the few files
  of /etc the dynamic linker needs, the interpreter's prefix when it lives elsewhere, /dev/null,
  zero, full, random and urandom, a fresh /proc of its own PID namespace (none where the host
  forbids mounting one, as containers that mask parts of theirs do), and tmpfs /tmp and /work of
  `disk_bytes` each. `pivot_root` then detaches the host's filesystem: no /home, /root, /work,
  /var, /run or host /tmp, so a workspace's `.swarm/private/` and state database are not there to
  read whatever their modes;
- the supervisor as PID 1 of the PID namespace (when it exits the kernel kills what is left), and
  every capability dropped with no-new-privileges before it starts, so the code cannot unmount the
  new root's mounts to look underneath.

The setup runs as a short POSIX shell script (`SETUP_SCRIPT`) inside the new namespaces; a failed
step stops the run before anything untrusted starts. `probe` checks once per configuration that
the whole chain works here (user namespaces may be disabled by the kernel or a container's
seccomp profile) and says why when it does not.

Not enforced here (as with bubblewrap): `cpus` and aggregate memory; RLIMIT_NPROC counts the
processes of the sandbox's own user namespace.
"""
from __future__ import annotations

import glob
import os
import shutil

# Runs as `sh -c SETUP_SCRIPT sandbox-setup SIZE N PATH_1..PATH_N COMMAND...` inside the new
# namespaces. The host's filesystem is still visible while it runs; /tmp is only the mount point of
# the new root (a tmpfs mounted in this mount namespace, so the host's /tmp is untouched).
SETUP_SCRIPT = r"""
set -eu
PATH=/usr/sbin:/usr/bin:/sbin:/bin
size=$1; n=$2; shift 2
mount -t tmpfs -o mode=0755,size=1048576 swarm-root /tmp
cd /tmp
while [ "$n" -gt 0 ]; do
  p=$1; shift; n=$((n - 1))
  if [ -L "$p" ]; then
    ln -s "$(readlink "$p")" ".$p"
  elif [ -d "$p" ]; then
    mkdir -p ".$p"; mount --rbind "$p" ".$p"; mount -o remount,bind,ro ".$p"
  elif [ -e "$p" ]; then
    mkdir -p ".$(dirname "$p")"; : > ".$p"; mount --bind "$p" ".$p"; mount -o remount,bind,ro ".$p"
  fi
done
mkdir -p dev proc tmp work .old
for d in null zero full random urandom; do : > "dev/$d"; mount --bind "/dev/$d" "dev/$d"; done
# a container that masks parts of its /proc forbids a new proc mount: then the sandbox has none
mount -t proc -o nosuid,nodev,noexec proc proc 2>/dev/null || rmdir proc
mount -t tmpfs -o nosuid,nodev,size="$size" swarm-tmp tmp
mount -t tmpfs -o nosuid,nodev,size="$size" swarm-work work
pivot_root . .old
umount -l /.old
rmdir /.old
mount -o remount,bind,ro /
cd /work
exec setpriv --bounding-set=-all --inh-caps=-all --no-new-privs -- "$@"
"""

NAMESPACES = ("--user", "--map-root-user", "--mount", "--net", "--pid", "--ipc", "--uts", "--cgroup")
ROOT_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime")
TOOLS = ("unshare", "mount", "pivot_root", "setpriv", "umount")


def root_paths(python: str) -> list[str]:
    """Host paths bound read-only into the new root: system dirs (links kept as links), the
    linker's files of /etc, and the interpreter's prefix when it lives outside them."""
    paths = [p for p in ROOT_DIRS if os.path.lexists(p)]
    paths += [p for p in (*ETC_FILES, *sorted(glob.glob("/etc/python3*"))) if os.path.exists(p)]
    real = os.path.realpath(python)
    if not real.startswith(("/usr/", "/bin/", "/lib")):
        paths.append(os.path.dirname(os.path.dirname(real)))
    return paths


def missing_tools(unshare: str = "unshare") -> list[str]:
    """The util-linux programs this backend needs that are not installed here (`unshare`: the
    host's program, a path or a name on PATH; the others run inside, from the system dirs)."""
    search = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    missing = [] if shutil.which(unshare) else [unshare]
    return missing + [t for t in TOOLS[1:] if shutil.which(t, path=search) is None]


def unshare_argv(unshare: str, disk_bytes: int, paths: list[str]) -> list[str]:
    """The command prefix that builds the sandbox; append the command to run inside it."""
    return [unshare, *NAMESPACES, "--fork", "--kill-child", "--", "/bin/sh", "-c", SETUP_SCRIPT,
            "sandbox-setup", str(disk_bytes), str(len(paths)), *paths]
