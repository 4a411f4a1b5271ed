#!/usr/bin/env bash
# Installs a container engine for tests/e2e/test_docker.py's container test (podman, runc, debootstrap from
# Debian's packages; podman-compose from the package index into the active virtual environment) and configures
# podman for a VM with cgroup v1 and no systemd: runc instead of crun (crun stops at "cgroups in hybrid mode
# not supported"), no default ulimits (setting RLIMIT_NOFILE is not permitted there), cgroupfs, file events.
# Idempotent: a second run changes nothing. Needs root and apt-get; says so and does nothing (exit 0) without them.
set -euo pipefail

if ! command -v apt-get > /dev/null || ((EUID != 0)); then
  echo "install_engine: needs root and apt-get; install podman, runc, debootstrap and podman-compose yourself" >&2
  exit 0
fi
start=$(date +%s)

missing=()
for tool in podman runc debootstrap; do
  command -v "$tool" > /dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends podman runc debootstrap uidmap slirp4netns \
    containernetworking-plugins iptables fuse-overlayfs catatonit > /dev/null
fi

conf=/etc/containers/containers.conf
if ! grep -qs "segtrain: install_engine.sh" "$conf"; then
  mkdir -p /etc/containers
  cat > "$conf" << 'EOF'
# segtrain: install_engine.sh (cgroup v1 VM without systemd)
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
fi

# podman-compose 1.6.0 (Debian's 1.0.3 lacks `include`) into the active virtual environment.
if ! python -c 'import importlib.metadata as m; assert m.version("podman-compose") == "1.6.0"' 2> /dev/null; then
  python -m pip install -q 'podman-compose==1.6.0'
fi

podman --version
podman-compose --version | tail -n 1
echo "install_engine: $(($(date +%s) - start)) s"
