#!/usr/bin/env bash
# Stands in for hack/kubelet-plugin-prestart.sh of NVIDIA's DRA driver for GPUs, which its image runs as the
# kubelet plugin's init container (the chart's templates/kubeletplugin.yaml: bash
# /usr/bin/kubelet-plugin-prestart.sh) and which the vendored source in ../shared/peers lacks: its
# Dockerfile copies it from hack/, not in the tarball. It does the check that script is there for, written
# here, not copied: the driver root (NVIDIA_DRIVER_ROOT, mounted through its parent at /driver-root-parent)
# holds nvidia-smi and libnvidia-ml.so.1; if not, it says which is missing and fails, and the kubelet starts
# it again. Bash builtins only: the image the harness builds (e2e/nvidia_dra_scenario.go) has bash and no
# coreutils.
set -u

root="${NVIDIA_DRIVER_ROOT:-/}"
if [ "$root" = / ]; then
  seen=/driver-root-parent
else
  root="${root%/}"
  seen="/driver-root-parent/${root##*/}"
fi

missing=()
[ -e "$seen/usr/bin/nvidia-smi" ] || [ -e "$seen/bin/nvidia-smi" ] || missing+=(nvidia-smi)
found=""
for dir in usr/lib/x86_64-linux-gnu usr/lib64 lib/x86_64-linux-gnu lib64 usr/lib; do
  [ -e "$seen/$dir/libnvidia-ml.so.1" ] && found="$dir"
done
[ -n "$found" ] || missing+=(libnvidia-ml.so.1)

if [ ${#missing[@]} -gt 0 ]; then
  echo "kubelet-plugin-prestart: the driver root $root (here $seen) lacks ${missing[*]}: is the NVIDIA driver installed there?" >&2
  exit 1
fi
echo "kubelet-plugin-prestart: the driver root $root holds nvidia-smi and $found/libnvidia-ml.so.1"
