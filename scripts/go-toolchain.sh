# Sourced by scripts/go and scripts/install-deps.sh: which Go the project needs, and where to find it.
# e2e/go.mod's `go` line is the minimum (the pinned Kubernetes release's own); the toolchain fetched when
# none is installed is pinned here with its checksum from sum.golang.org.
GPUGUARD_GO_MIN=1.26.7
GPUGUARD_GO_TOOLCHAIN=go1.26.8
GPUGUARD_GO_TOOLCHAIN_SUM="h1:ZOmGe1OnfREDMIdb1Qi4G9JSuDPBLGExZMQ4nis1RXM="

gpuguard_go_toolchain_dir() {
  local modcache="${GOMODCACHE:-${GOPATH:-$HOME/go}/pkg/mod}"
  echo "$modcache/golang.org/toolchain@v0.0.1-$GPUGUARD_GO_TOOLCHAIN.linux-$(gpuguard_go_arch)"
}

gpuguard_go_arch() {
  case "$(uname -m)" in
    x86_64) echo amd64 ;;
    aarch64|arm64) echo arm64 ;;
    *) uname -m ;;
  esac
}

# True when the Go binary $1 reports a version of at least GPUGUARD_GO_MIN.
gpuguard_go_is_recent() {
  local version
  version="$(GOTOOLCHAIN=local "$1" env GOVERSION 2>/dev/null)" || return 1
  version="${version#go}"
  [ "$(printf '%s\n%s\n' "$GPUGUARD_GO_MIN" "${version%%[!0-9.]*}" | sort -V | head -n1)" = "$GPUGUARD_GO_MIN" ]
}

# Prints the path of a usable go binary, or fails.
gpuguard_go() {
  local candidate
  for candidate in "$(command -v go || true)" "$(gpuguard_go_toolchain_dir)/bin/go"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] && gpuguard_go_is_recent "$candidate"; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}
