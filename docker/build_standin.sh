#!/usr/bin/env bash
# Builds a local stand-in for the NGC PyTorch image from Debian's packages only, for machines that cannot
# reach nvcr.io or Docker Hub (tests/e2e/test_docker.py builds and runs the project's image on it):
#
#   docker/build_standin.sh [IMAGE]          (default localhost/ngc-standin:trixie; needs root, debootstrap, podman)
#   NGC_IMAGE=localhost/ngc-standin NGC_TAG=trixie PYTHON_IMAGE=localhost/ngc-standin:trixie docker compose build
#
# What it offers the Dockerfile, as NGC does: `python` and `pip` first on PATH, with setuptools, installing where
# `python` looks (a virtual environment over Debian trixie's Python 3.13 and its packages); torch and torchvision
# preinstalled (Debian's CPU builds, 2.6 and 0.21, numpy 2.2) and known to pip;
# /opt/nvidia/nvidia_entrypoint.sh, which runs its arguments; /workspace; a torchrun that starts although Debian's
# torch is built without libuv.
# pip reaches the index the host's pip uses (its index-url when that is an http(s) URL, else PyPI) and trusts the
# host's own certificate authorities (/usr/local/share/ca-certificates).
# Not shown: CUDA, NCCL, GPUs, NGC's OpenCV build and constraint file, Ubuntu's user 1000 (see docker/README.md).
# An existing image is kept (REBUILD=1 rebuilds it). MIRROR picks the Debian mirror.
set -euo pipefail

image=${1:-localhost/ngc-standin:trixie}
mirror=${MIRROR:-http://deb.debian.org/debian}
if [[ -z "${REBUILD:-}" ]] && podman image exists "$image"; then
  echo "build_standin: $image exists (REBUILD=1 rebuilds it)"
  exit 0
fi
start=$(date +%s)
rootfs=$(mktemp -d /var/tmp/ngc-standin.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT

debootstrap --variant=minbase trixie "$rootfs" "$mirror" > "$rootfs.log" 2>&1 || {
  tail -n 20 "$rootfs.log"
  exit 1
}
rm -f "$rootfs.log"
chroot "$rootfs" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  python3-torch python3-torchvision python3-pip python3-setuptools python3-venv ca-certificates > /dev/null
chroot "$rootfs" apt-get clean
# Debian's torch is built without libuv, which TCPStore asks for by default (NGC's torch has it): every
# TCPStore call in torch.distributed follows USE_LIBUV, set to 0 below.
python3 "$(dirname "$0")/standin_libuv.py" "$rootfs/usr/lib/python3/dist-packages/torch/distributed"
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin
# NGC's `python` is the one pip installs into, and pip can upgrade what it finds there. pip cannot uninstall
# Debian's packages (no RECORD file): a virtual environment that sees them, first on PATH, gets the upgrades.
chroot "$rootfs" python3 -m venv --system-site-packages /opt/venv

printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$rootfs/etc/pip.conf"
index=$(pip config get global.index-url 2> /dev/null || true)
if [[ "$index" == http://* || "$index" == https://* ]]; then
  printf 'index-url = %s\n' "$index" >> "$rootfs/etc/pip.conf"
fi
# The host's own certificate authorities (a TLS-inspecting proxy's, a company's): pip in the image trusts what
# pip on the host trusts.
if compgen -G "/usr/local/share/ca-certificates/*.crt" > /dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
  cat /usr/local/share/ca-certificates/*.crt >> "$rootfs/etc/ssl/certs/ca-certificates.crt"
fi

mkdir -p "$rootfs/opt/nvidia" "$rootfs/workspace"
cat > "$rootfs/opt/nvidia/nvidia_entrypoint.sh" << 'EOF'
#!/bin/bash
# Stand-in for NGC's entrypoint (driver checks, CUDA forward compatibility, banner): runs the command.
exec "$@"
EOF
chmod 755 "$rootfs/opt/nvidia/nvidia_entrypoint.sh"

tar -C "$rootfs" -c . | podman import \
  --change 'ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh"]' \
  --change 'WORKDIR /workspace' \
  --change 'ENV USE_LIBUV=0' \
  --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --quiet - "$image" > /dev/null
podman run --rm "$image" python -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)'
echo "build_standin: $image in $(($(date +%s) - start)) s, $(podman image inspect --format '{{.Size}}' "$image") bytes"
