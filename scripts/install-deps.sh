#!/usr/bin/env bash
# Installs every Debian bookworm package that building, testing and running gpuguard needs.
# Idempotent: when everything is already installed it changes nothing and does not touch the network.
set -euo pipefail

packages=(
  # toolchain
  g++ cmake make pkg-config
  # webhook: Boost.Beast/Asio (header-only) + Program_options, OpenSSL 3, JSON
  libboost1.81-dev libboost-program-options1.81-dev
  libssl-dev openssl
  nlohmann-json3-dev libsimdjson-dev
  # device plugin: gRPC C++ and protobuf, with the code generators
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # tests (python3-yaml: the manifest render test reads what kustomize produced)
  catch2 python3 python3-yaml
  # fuzzing (clang's libFuzzer and sanitizer runtimes) and benchmarks (Google Benchmark, wrk)
  clang libclang-rt-14-dev libbenchmark-dev wrk
  # `make run` prints a curl line; the README walkthrough uses it
  curl
)

# The admission-policy test evaluates CEL with @bufbuild/cel (tests/vap/package-lock.json) under Node.js.
# A node that is already there (say from NodeSource, which bundles npm) is used as it is: Debian's npm
# package would try to replace it.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

cmd=(apt-get install -y --no-install-recommends "${missing[@]}")
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root:  apt-get update && ${cmd[*]}" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
"${cmd[@]}"
