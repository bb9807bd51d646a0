#!/usr/bin/env bash
# Shared provisioning for scripts/run and scripts/test: make sure a Docker
# engine answers on this machine, installing and starting one when needed.
# Sourced, not executed. Everything here is idempotent so a second run is fast.

# ensure_docker: install docker.io when no dockerd exists, start dockerd when
# no engine answers, and wait until `docker info` succeeds.
ensure_docker() {
  if docker info >/dev/null 2>&1; then
    return 0
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    echo "==> installing docker.io (no Docker engine on this machine)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
  fi
  if ! pgrep -x dockerd >/dev/null 2>&1; then
    # A killed dockerd leaves its pid file behind and the next one refuses to start.
    rm -f /var/run/docker.pid
    echo "==> starting dockerd (log: /var/log/dockerd.log)"
    nohup dockerd >/var/log/dockerd.log 2>&1 &
    STARTED_DOCKERD=1
  fi
  for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
      return 0
    fi
    sleep 1
  done
  echo "dockerd did not become ready; see /var/log/dockerd.log" >&2
  return 1
}

# stop_docker_if_started: stop the engine when this script started it, so
# that a test run leaves nothing running.
stop_docker_if_started() {
  if [ "${STARTED_DOCKERD:-0}" = 1 ]; then
    echo "==> stopping the dockerd this run started"
    pkill -x dockerd || true
    for _ in $(seq 1 30); do
      pgrep -x dockerd >/dev/null 2>&1 || break
      sleep 1
    done
    pkill -x containerd || true
  fi
}

# register_runtime NAME PATH [ARG...]: adds the OCI runtime NAME (the
# program PATH, started with the ARGs) to /etc/docker/daemon.json, keeping
# what the file already holds, and has dockerd reload it (SIGHUP: no restart,
# running containers stay). Waits until the engine lists it.
register_runtime() {
  local name=$1 path=$2
  shift 2
  echo "==> registering $name with dockerd"
  mkdir -p /etc/docker || return 1
  python3 - "$name" "$path" "$@" <<'PY' || return 1
import json, os, sys
name, path, args = sys.argv[1], sys.argv[2], sys.argv[3:]
conf_path = "/etc/docker/daemon.json"
conf = json.load(open(conf_path)) if os.path.exists(conf_path) and os.path.getsize(conf_path) else {}
runtime = {"path": path}
if args:
    runtime["runtimeArgs"] = args
conf.setdefault("runtimes", {})[name] = runtime
json.dump(conf, open(conf_path, "w"), indent=2)
PY
  pkill -HUP -x dockerd
  for _ in $(seq 1 30); do
    if runtime_registered "$name"; then
      return 0
    fi
    sleep 1
  done
  echo "$name did not register with dockerd" >&2
  return 1
}

# runtime_registered NAME: whether the engine lists the OCI runtime NAME.
runtime_registered() {
  docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q "\"$1\""
}

# install_package PROGRAM PACKAGE: installs the Debian PACKAGE unless PROGRAM
# is already on the PATH.
install_package() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "==> installing $2"
    apt-get update -qq || return 1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null || return 1
  fi
}

# ensure_runsc: install gVisor's runsc and register it with dockerd as the
# runtime "runsc" (ptrace platform, no network, host unix sockets allowed so
# the agent's socket on a bind mount works). Idempotent.
ensure_runsc() {
  # Registered and present: a daemon.json kept from an earlier install may
  # name a program that is gone.
  runtime_registered runsc && [ -x /usr/bin/runsc ] && return 0
  install_package runsc runsc || return 1
  register_runtime runsc /usr/bin/runsc --platform=ptrace --network=none --host-uds=all
}

# ensure_crun: install crun (a runc-compatible runtime written in C) and
# register it with dockerd as the runtime "crun", for
# `sandbox.runtime = "crun"`, with the cgroup layout it needs. Idempotent.
ensure_crun() {
  if ! runtime_registered crun || [ ! -x /usr/bin/crun ]; then
    install_package crun crun || return 1
    register_runtime crun /usr/bin/crun || return 1
  fi
  crun_cgroups
}

# crun_cgroups: crun refuses a hybrid cgroup layout (v1 controllers, plus a
# cgroup2 hierarchy at /sys/fs/cgroup/unified) while any controller is still
# available on the cgroup2 side: every container start fails with "cgroups in
# hybrid mode not supported, drop all controllers from cgroupv2". On these
# machines that is hugetlb alone, which no v1 hierarchy holds. Mounting each
# such controller as a v1 hierarchy of its own, as a pure v1 host has it, lets
# crun run; runc then uses it too. Not kept across a reboot, so done on every
# call; a no-op without the hybrid layout.
crun_cgroups() {
  local unified=/sys/fs/cgroup/unified controller
  [ "$(stat -fc %T "$unified" 2>/dev/null)" = cgroup2fs ] || return 0
  for controller in $(cat "$unified/cgroup.controllers"); do
    echo "==> mounting the $controller cgroup controller as a v1 hierarchy (crun refuses it on cgroup2 in hybrid mode)"
    mkdir -p "/sys/fs/cgroup/$controller" || return 1
    if ! mount -t cgroup -o "$controller" cgroup "/sys/fs/cgroup/$controller"; then
      echo "could not move $controller off cgroup2: crun cannot start containers here" >&2
      return 1
    fi
  done
}

# ensure_etcd: Debian's etcd server and etcdctl, for the cluster (scripts/cluster).
ensure_etcd() {
  install_package etcd etcd-server || return 1
  install_package etcdctl etcd-client
}
