#!/usr/bin/env bash
# `make test-image`: the image's root filesystem, assembled by scripts/image-rootfs.sh exactly as the
# Dockerfile's final stage copies it onto its distroless base (the base laid out from the same Debian
# packages, since no image can be pulled here), mounted read-only, with each binary run inside it as the
# image runs it:
#   - all three print --version as UID 65532;
#   - the webhook serves /healthz over TLS as UID 65532;
#   - the device plugin, as root as its DaemonSet runs it, serves its probes and metrics over a fake
#     host tree, with only the kubelet's plugin directory writable.
# A missing shared library, a write into the image, or a shell the binaries need fail here.
#   image_test.sh BUILD_DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "$1" && pwd)"
[ "$(id -u)" = 0 ] || { echo "image_test.sh: needs root for unshare --mount and chroot, as CI has"; exit 1; }
work="$(mktemp -d)"
pids=()
cleanup() {
  # Each pid is an unshare (in_image), which ignores SIGTERM while it waits for its child, and whose
  # --kill-child signal the child loses when chroot changes its user: so the child (the program, by then)
  # is told first, and unshare ends when it does.
  for pid in "${pids[@]}"; do pkill -TERM -P "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
rootfs="$work/rootfs"

"$root/scripts/image-rootfs.sh" "$build" "$rootfs" --base
"$root/scripts/image-rootfs.sh" "$build" "$work/layer"
for shell in bin/sh bin/bash usr/bin/sh usr/bin/bash bin/busybox; do
  [ ! -e "$rootfs/$shell" ] || { echo "the image has a shell: /$shell"; exit 1; }
done
image_bytes=$(du -sb "$rootfs" | cut -f1)
layer_bytes=$(du -sb "$work/layer" | cut -f1)

# What the kubelet mounts into the pods: the serving certificate (a Secret volume, mode 0644), the
# kubelet's plugin directory, the host's /dev and driver files.
mkdir -p "$rootfs/etc/gpuguard/tls" "$rootfs/var/lib/kubelet/device-plugins" "$rootfs/host"
"$root/certs/generate.sh" --out "$work/certs" >/dev/null
mkdir -p "$work/secret"
cp "$work/certs/tls.crt" "$work/certs/tls.key" "$work/secret/" && chmod 0644 "$work/secret/"*
host="$work/host"
for minor in 0 1; do
  pci="0000:1${minor}:00.0"
  mkdir -p "$host/proc/driver/nvidia/gpus/$pci" "$host/dev" "$host/sys/bus/pci/devices/$pci"
  printf 'Model: \t NVIDIA H100 80GB HBM3\nGPU UUID: \t GPU-1mage000-0000-4000-8000-00000000000%s\nDevice Minor: \t %s\n' \
    "$minor" "$minor" > "$host/proc/driver/nvidia/gpus/$pci/information"
  : > "$host/dev/nvidia$minor"
done
: > "$host/dev/fuse"

# in_image USER:GROUP PROGRAM ARGS...: PROGRAM run chrooted in the read-only root filesystem, with the
# mounts above, in a mount namespace of its own that ends with it. exec: run in the background, the
# function's subshell becomes unshare itself, so that $! is unshare, whose child cleanup() can find.
in_image() {
  local user="$1"
  shift
  exec unshare --mount --fork --kill-child=SIGTERM -- /bin/bash -c '
    set -e
    rootfs="$1" secret="$2" host="$3" user="$4"
    shift 4
    mount --make-rprivate /
    mount --bind "$rootfs" "$rootfs"
    mount -t proc proc "$rootfs/proc"
    mount --rbind /dev "$rootfs/dev"
    mount --bind "$secret" "$rootfs/etc/gpuguard/tls"
    mount -o remount,bind,ro "$rootfs/etc/gpuguard/tls"
    mount --bind "$host" "$rootfs/host"
    mount -o remount,bind,ro "$rootfs/host"
    mount -t tmpfs -o mode=0750 tmpfs "$rootfs/var/lib/kubelet/device-plugins"
    mount -o remount,bind,ro "$rootfs"
    exec chroot --userspec="$user" "$rootfs" "$@"' _ "$rootfs" "$work/secret" "$host" "$user" "$@"
}

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# until SECONDS COMMAND...: COMMAND succeeds within SECONDS.
until_ok() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
}

for program in gpuguard-webhook gpuguard-device-plugin gpuguard-scheduler-extender gpuguard-node-enforcer; do
  version="$(in_image 65532:65532 "/usr/local/bin/$program" --version)" \
    || { echo "$program --version failed inside the image"; exit 1; }
  echo "$program --version in the image, as 65532: $version"
done

# The mask check, which the host runs (CRI-O's createRuntime hook): linked statically, so that it needs
# nothing of a host's libraries; inside the image it starts and, given no hook arguments, exits 2 with its
# usage.
if readelf -l "$rootfs/usr/local/bin/gpuguard-mask-check" | grep -q INTERP; then
  echo "gpuguard-mask-check in the image loads a dynamic linker; the host runs it, so it must be static"
  exit 1
fi
status=0
usage="$(in_image 0:0 /usr/local/bin/gpuguard-mask-check 2>&1 < /dev/null)" || status=$?
[ "$status" = 2 ] && [[ "$usage" == *"usage: gpuguard-mask-check"* ]] \
  || { echo "gpuguard-mask-check in the image: exit $status, $usage; want 2 and its usage"; exit 1; }
echo "gpuguard-mask-check in the image: static, says its usage"

port=$(free_port)
in_image 65532:65532 /usr/local/bin/gpuguard-webhook --tls-cert-file=/etc/gpuguard/tls/tls.crt \
  --tls-private-key-file=/etc/gpuguard/tls/tls.key --listen-address="127.0.0.1:$port" --shutdown-delay=0 \
  > "$work/webhook.log" 2>&1 &
pids+=($!)
until_ok 20 curl -sf --cacert "$work/certs/ca.crt" "https://127.0.0.1:$port/healthz" \
  || { cat "$work/webhook.log"; echo "the webhook in the image did not serve /healthz over TLS"; exit 1; }
echo "the webhook in the image, as 65532 on a read-only root, serves /healthz over TLS"

port=$(free_port)
# No kubelet here, so no pod-resources API to ask what other plugins serve: not asked (docs/device-plugin.md).
in_image 0:0 /usr/local/bin/gpuguard-device-plugin --host-root=/host --discovery=procfs --pod-resources-socket "" \
  --device-plugin-dir=/var/lib/kubelet/device-plugins/ --host-device=github.com/fuse=/dev/fuse:4 \
  --metrics-address="127.0.0.1:$port" > "$work/device-plugin.log" 2>&1 &
pids+=($!)
metrics() { curl -sf "http://127.0.0.1:$port/metrics" | grep -q "$1"; }
until_ok 20 metrics 'gpuguard_device_plugin_devices{resource="nvidia.com/gpu",health="healthy"} 2' \
  || { cat "$work/device-plugin.log"; echo "the device plugin in the image did not serve its two GPUs"; exit 1; }
metrics 'gpuguard_device_plugin_devices{resource="github.com/fuse",health="healthy"} 4'
grep -q '"msg":"serving","resource":"nvidia.com/gpu"' "$work/device-plugin.log" \
  || { cat "$work/device-plugin.log"; echo "the device plugin did not serve its socket"; exit 1; }
echo "the device plugin in the image, on a read-only root, serves two GPUs and four fuse slots over a fake host"

echo "image root filesystem: $image_bytes bytes ($((image_bytes / 1048576)) MiB), of which gpuguard's layer is $layer_bytes bytes ($((layer_bytes / 1048576)) MiB)"
