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

# ensure_runsc: install gVisor's runsc and register it with dockerd as the
# runtime "runsc" (ptrace platform, no network, host unix sockets allowed so
# the agent's socket on a bind mount works). Idempotent.
ensure_runsc() {
  if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; then
    return 0
  fi
  if ! command -v runsc >/dev/null 2>&1; then
    echo "==> installing runsc (gVisor)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >/dev/null
  fi
  echo "==> registering runsc with dockerd"
  mkdir -p /etc/docker
  python3 - <<'PY'
import json, os
path = "/etc/docker/daemon.json"
conf = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
conf.setdefault("runtimes", {})["runsc"] = {
    "path": "/usr/bin/runsc",
    "runtimeArgs": ["--platform=ptrace", "--network=none", "--host-uds=all"],
}
json.dump(conf, open(path, "w"), indent=2)
PY
  pkill -HUP -x dockerd
  for _ in $(seq 1 30); do
    if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; then
      return 0
    fi
    sleep 1
  done
  echo "runsc did not register with dockerd" >&2
  return 1
}
