#!/usr/bin/env bash
# Stands in for hack/kubelet-plugin-prestart.sh of NVIDIA's DRA driver for GPUs, which its image runs as the
# kubelet plugin's init container (the chart's templates/kubeletplugin.yaml: bash
# /usr/bin/kubelet-plugin-prestart.sh) and which the vendored source in ../shared/peers lacks: its
# Dockerfile copies it from hack/, not in the tarball. Written here, not copied, to do what that script
# does at commit 22407113: every 10 s, look for nvidia-smi and libnvidia-ml.so.1 in the driver root
# (NVIDIA_DRIVER_ROOT, mounted through its parent at /driver-root-parent) where the driver installs them,
# run `nvidia-smi --version` with that library preloaded, and end, successfully, once it succeeds; until
# then, say what is missing and keep waiting, so that the pod stays in its init container. NVIDIA's also
# prints hints for particular driver roots (GKE's, the GPU Operator's) every sixth attempt; this does not.
# It runs on bash and the image's busybox (sleep, env), as NVIDIA's image has them.
set -u
# As PID 1 of its container, bash would ignore the kubelet's SIGTERM and wait out the grace period.
trap 'exit 143' TERM INT

root="${NVIDIA_DRIVER_ROOT:-/}"
if [ "$root" = / ]; then
  seen=/driver-root-parent
else
  root="${root%/}"
  seen="/driver-root-parent/${root##*/}"
fi

# first_file DIR... NAME: the first DIR/NAME that is a file (through links), or nothing.
first_file() {
  local name="${*: -1}" dir
  for dir in "${@:1:$#-1}"; do
    if [ -f "$seen/$dir/$name" ]; then
      echo "$seen/$dir/$name"
      return
    fi
  done
}

while true; do
  smi="$(first_file opt/bin usr/bin usr/sbin bin sbin nvidia-smi)"
  nvml="$(first_file usr/lib64 usr/lib/x86_64-linux-gnu usr/lib/aarch64-linux-gnu lib64 lib/x86_64-linux-gnu \
    lib/aarch64-linux-gnu libnvidia-ml.so.1)"
  missing=()
  [ -n "$smi" ] || missing+=(nvidia-smi)
  [ -n "$nvml" ] || missing+=(libnvidia-ml.so.1)
  if [ ${#missing[@]} -eq 0 ]; then
    env -i LD_PRELOAD="$nvml" "$smi" --version
    code=$?
    if [ $code -eq 0 ]; then
      echo "kubelet-plugin-prestart: the driver root $root holds $smi and $nvml, and nvidia-smi runs"
      exit 0
    fi
    echo "kubelet-plugin-prestart: $smi --version failed (exit $code); trying again in 10 s"
  else
    echo "kubelet-plugin-prestart: the driver root $root (here $seen) lacks ${missing[*]}: is the NVIDIA driver installed there? Trying again in 10 s"
  fi
  sleep 10
done
