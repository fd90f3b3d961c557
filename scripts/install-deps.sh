#!/usr/bin/env bash
# Installs every Debian bookworm package that building, testing and running gpuguard needs, and a Go
# toolchain for the Go-built tools (kustomize) and the end-to-end harness when the machine has none recent
# enough. Idempotent: when everything is already there it changes nothing and does not touch the network.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

packages=(
  # toolchain (ccache: a clean clone compiles again only what changed, CMakeLists.txt says how)
  g++ cmake make pkg-config ccache
  # webhook: Boost.Beast/Asio (header-only) + Program_options, OpenSSL 3, JSON
  libboost1.81-dev libboost-program-options1.81-dev
  libssl-dev openssl
  nlohmann-json3-dev libsimdjson-dev
  # device plugin: gRPC C++ and protobuf, with the code generators
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # device plugin: its config file (YAML, as NVIDIA's); the node report: the toolkit's, containerd's and
  # CRI-O's configs (TOML, header-only) and the CDI specs (YAML)
  libyaml-cpp-dev libtomlplusplus-dev
  # tests (python3-yaml: the manifest render test reads what kustomize produced)
  catch2 python3 python3-yaml
  # fuzzing (clang's libFuzzer and sanitizer runtimes), benchmarks (Google Benchmark, wrk) and their
  # profiles (callgrind's instruction counts, stable on noisy machines)
  clang libclang-rt-14-dev libbenchmark-dev wrk valgrind
  # make bench-nginx-floor: nginx as the webhook's transport floor (a bench peer only; strace counts the
  # system calls of both)
  nginx-light strace
  # make format and make lint (.clang-format, .clang-tidy)
  clang-format clang-tidy
  # `make run` prints a curl line; the README walkthrough and `make test-image` use it
  curl
  # `make test-image`: the image's base (CA certificates) and unshare/chroot
  ca-certificates util-linux coreutils
  # `make e2e`'s real node: runc under NVIDIA's runtime, the CNI bridge, its network and the CUDA-like
  # test image's shell (containerd, the kubelet and NVIDIA's runtime are built from e2e/go.mod)
  runc containernetworking-plugins iproute2 iptables busybox-static
  # the real node on CRI-O (make e2e E2E_RUNTIME=crio): its monitor at run time, and what crio, built by
  # scripts/build-peers from ../shared/peers, links (seccomp; SQLite in place of the amalgamation the
  # vendored tarball lacks)
  conmon libseccomp-dev libsqlite3-dev
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

if [ ${#missing[@]} -gt 0 ]; then
  cmd=(apt-get install -y --no-install-recommends "${missing[@]}")
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages: ${missing[*]}" >&2
    echo "install-deps: run as root:  apt-get update && ${cmd[*]}" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Installing a daemon's package (nginx-light) starts it, unless policy-rc.d says no (Debian's
  # invoke-rc.d policy): a package installed for a benchmark must not leave a server on port 80.
  policy=/usr/sbin/policy-rc.d
  wrote_policy=""
  if [ ! -e "$policy" ]; then
    wrote_policy=yes
    printf '#!/bin/sh\n# written by gpuguard scripts/install-deps.sh while it installs packages\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  "${cmd[@]}"
  if [ -n "$wrote_policy" ]; then
    rm -f "$policy"
    trap - EXIT
  fi
fi

# Go: Debian bookworm's golang is 1.19, too old for the pinned Kubernetes release and too old to fetch a
# newer toolchain itself. So, as GOTOOLCHAIN does, take the golang.org/toolchain module from the module
# proxy, check it against the pinned go.sum hash, and unpack it into the module cache.
# shellcheck source=scripts/go-toolchain.sh
. "$root/scripts/go-toolchain.sh"
if ! gpuguard_go >/dev/null; then
  dir="$(gpuguard_go_toolchain_dir)"
  version="v0.0.1-$GPUGUARD_GO_TOOLCHAIN.linux-$(gpuguard_go_arch)"
  proxy="${GOPROXY:-https://proxy.golang.org}"
  proxy="${proxy%%[,|]*}"
  [ "$proxy" = direct ] || [ "$proxy" = off ] && proxy=https://proxy.golang.org
  echo "install-deps: no Go $GPUGUARD_GO_MIN or later; fetching golang.org/toolchain@$version from $proxy" >&2
  download="$(mktemp -d)"
  trap 'rm -rf "$download"' EXIT
  curl -fsSL --retry 3 -o "$download/toolchain.zip" "$proxy/golang.org/toolchain/@v/$version.zip"
  python3 - "$download/toolchain.zip" "$GPUGUARD_GO_TOOLCHAIN_SUM" "$dir" <<'PY'
# Checks the module zip against its go.sum hash (dirhash "h1") before anything is unpacked.
import base64, hashlib, os, sys, zipfile
archive, want, target = sys.argv[1:4]
with zipfile.ZipFile(archive) as z:
    names = sorted(i.filename for i in z.infolist() if not i.is_dir())
    summary = "".join(f"{hashlib.sha256(z.read(n)).hexdigest()}  {n}\n" for n in names)
    got = "h1:" + base64.b64encode(hashlib.sha256(summary.encode()).digest()).decode()
    if got != want:
        sys.exit(f"install-deps: {archive} has hash {got}, not the pinned {want}; not unpacking it")
    prefix = "golang.org/" + os.path.basename(target) + "/"  # entries are <module>@<version>/...
    staging = target + ".partial"
    for info in z.infolist():
        if info.is_dir() or not info.filename.startswith(prefix):
            continue
        path = os.path.join(staging, info.filename[len(prefix):])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            out.write(z.read(info))
        os.chmod(path, (info.external_attr >> 16) & 0o755 or 0o644)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.rename(staging, target)
PY
  gpuguard_go >/dev/null || { echo "install-deps: the unpacked toolchain in $dir does not run" >&2; exit 1; }
  echo "install-deps: Go toolchain in $dir" >&2
fi
