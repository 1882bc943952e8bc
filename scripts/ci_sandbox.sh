#!/usr/bin/env bash
# What the sandbox tests need, started before them and removed after: Debian's docker.io engine,
# bubblewrap, debootstrap, and the sandbox base image.
#
#   scripts/ci_sandbox.sh start    # install missing packages (apt-get), start a private dockerd,
#                                  # wait for it, build the base image (reused if it exists)
#   scripts/ci_sandbox.sh stop     # stop that dockerd and remove everything it created
#   scripts/ci_sandbox.sh status
#
# The private dockerd: data and exec roots, pid file and log under $SWARM_SANDBOX_STATE (default
# ${TMPDIR:-/tmp}/swarmlab-dockerd), listening on the default socket (/var/run/docker.sock, so the
# docker SDK finds it), with no bridge and no iptables rules (sandboxes run with --network none).
# If an engine already answers on the socket it is used as is and `stop` leaves it alone.
# The rootfs tarball of the image is cached in $SWARM_SANDBOX_CACHE (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/swarmlab/sandbox), so a fresh engine imports it in seconds.
#
# `start` never fails the CI run for an engine that cannot start (no root, no kernel support):
# it says why and exits 0, and the Docker tests then skip with the engine's error as the reason.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
state="${SWARM_SANDBOX_STATE:-${TMPDIR:-/tmp}/swarmlab-dockerd}"
cache="${SWARM_SANDBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/swarmlab/sandbox}"
py="${SWARM_PYTHON:-$root/.venv/bin/python}"
sock="/var/run/docker.sock"

log() { echo "[ci_sandbox] $*" >&2; }

engine_answers() {
  command -v docker >/dev/null 2>&1 || return 1
  timeout 10 docker -H "unix://$sock" version --format '{{.Server.Version}}' >/dev/null 2>&1
}

apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  log "installing $*"
  if ! { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }; then
    log "apt-get install $* failed"
    return 1
  fi
}

install_missing() {
  # bubblewrap on its own first: it is what isolates untrusted code on a machine without an
  # engine, so a failing docker.io install must not cost it (util-linux's unshare, the next
  # backend, is part of every Debian system)
  command -v bwrap >/dev/null 2>&1 || apt_install bubblewrap || true
  if command -v bwrap >/dev/null 2>&1; then
    log "bubblewrap: $(bwrap --version 2>&1)"
  fi
  local pkgs=()
  command -v dockerd >/dev/null 2>&1 || pkgs+=(docker.io)
  command -v debootstrap >/dev/null 2>&1 || pkgs+=(debootstrap)
  [ ${#pkgs[@]} -eq 0 ] && return 0
  apt_install "${pkgs[@]}"
}

our_pids() {  # processes started from our state dir (dockerd's containerd and shims), by pid
  local pid
  for pid in /proc/[0-9]*; do
    pid="${pid#/proc/}"
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$state/" && echo "$pid"
  done
}

start() {
  if [ "$(id -u)" != 0 ]; then
    log "not root: cannot install packages or start dockerd; Docker tests will skip"
    return 0
  fi
  install_missing || return 0
  if engine_answers; then
    if [ -f "$state/dockerd.pid" ] && kill -0 "$(cat "$state/dockerd.pid")" 2>/dev/null; then
      log "our dockerd (pid $(cat "$state/dockerd.pid")) is already running"
    else
      log "an engine already answers on $sock; using it (stop will leave it alone)"
    fi
  else
    mkdir -p "$state/data" "$state/exec"
    ip link show docker0 >/dev/null 2>&1 && touch "$state/docker0.preexisting"
    iptables -n -L DOCKER >/dev/null 2>&1 && touch "$state/iptables.preexisting"
    [ -e "$sock" ] || touch "$state/socket.ours"
    dockerd --data-root "$state/data" --exec-root "$state/exec" --pidfile "$state/dockerd.pid" \
      -H "unix://$sock" --bridge=none --iptables=false --ip-masq=false --userland-proxy=false \
      >"$state/dockerd.log" 2>&1 &
    for _ in $(seq 1 60); do
      engine_answers && break
      sleep 1
    done
    if ! engine_answers; then
      log "dockerd did not answer within 60 s; Docker tests will skip. Last log lines:"
      tail -n 5 "$state/dockerd.log" >&2
      stop
      return 0
    fi
    log "dockerd $(docker -H "unix://$sock" version --format '{{.Server.Version}}') up (pid $(cat "$state/dockerd.pid"), state $state)"
  fi
  if [ -x "$py" ]; then
    (cd "$root" && "$py" -m sandboxes.image --cache-dir "$cache") || log "building the base image failed (see above)"
  else
    log "no Python at $py (run scripts/bootstrap.sh); the Docker tests will build the image themselves"
  fi
  return 0
}

remove_iptables_chains() {
  local table chain rule
  for table in filter nat; do
    iptables -t "$table" -S 2>/dev/null | grep -E -- '-j DOCKER' | while read -r rule; do
      # shellcheck disable=SC2086
      iptables -t "$table" ${rule/-A/-D} 2>/dev/null || true
    done
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
      iptables -t "$table" -F "$chain" 2>/dev/null || true
      iptables -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
}

stop() {
  [ -d "$state" ] || { log "nothing to stop ($state does not exist)"; return 0; }
  local pid
  if [ -f "$state/dockerd.pid" ]; then
    pid="$(cat "$state/dockerd.pid")"
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
  fi
  for pid in $(our_pids); do kill -KILL "$pid" 2>/dev/null || true; done
  # Mounts dockerd may have left (overlays, shm, netns): innermost first.
  awk -v s="$state/" 'index($2, s) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  if [ ! -f "$state/docker0.preexisting" ] && ip link show docker0 >/dev/null 2>&1; then
    ip link delete docker0 && log "removed the docker0 bridge"
  fi
  if [ ! -f "$state/iptables.preexisting" ] && iptables -n -L DOCKER >/dev/null 2>&1; then
    remove_iptables_chains && log "removed DOCKER iptables chains"
  fi
  [ -f "$state/socket.ours" ] && rm -f "$sock"
  rm -rf --one-file-system "$state"
  log "stopped; removed $state"
}

status() {
  if engine_answers; then log "engine answers on $sock"; else log "no engine answers on $sock"; fi
  [ -f "$state/dockerd.pid" ] && log "our dockerd pid: $(cat "$state/dockerd.pid")"
  command -v bwrap >/dev/null 2>&1 && log "bubblewrap: $(bwrap --version)"
  return 0
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
