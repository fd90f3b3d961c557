#!/usr/bin/env bash
# What gpuguard's image adds to its distroless base, laid out in one place: the Dockerfile's final stage
# copies the tree this script makes, and `make test-image` runs the binaries inside the same tree.
#   image-rootfs.sh BUILD_DIR OUT_DIR [--base]
# The four programs and the mask check go to /usr/local/bin, and every shared library they load that the
# base image does not provide to /usr/lib/x86_64-linux-gnu. --base also lays out what gcr.io/distroless/cc-debian12
# provides (its glibc, libgcc, libstdc++ and libssl packages, CA certificates, the nonroot user), from
# this machine's Debian packages of the same names, for a test where no image can be pulled.
set -euo pipefail
build="$1"
out="$2"
programs=(gpuguard-webhook gpuguard-device-plugin gpuguard-scheduler-extender gpuguard-node-enforcer)
# The mask check, linked statically (the host runs it, CMakeLists.txt): beside the enforcer, which copies it.
static_programs=(gpuguard-mask-check)
# The distroless cc base's own libraries: not copied, the image has them.
base_libraries='/(libc|libm|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so'

mkdir -p "$out/usr/local/bin" "$out/usr/lib/x86_64-linux-gnu"
for program in "${programs[@]}" "${static_programs[@]}"; do
  install -m 0755 "$build/$program" "$out/usr/local/bin/$program"
done
ldd "${programs[@]/#/$build/}" | awk '$3 ~ /^\// {print $3}' | sort -u | { grep -Ev "$base_libraries" || true; } \
  | while read -r library; do cp -L "$library" "$out/usr/lib/x86_64-linux-gnu/"; done

[ "${3:-}" = "--base" ] || exit 0
# The base: distroless cc-debian12 is Debian 12's libc6, libgcc-s1, libstdc++6 and libssl3 with
# ca-certificates, a passwd with root, nobody and nonroot (65532), a world-writable /tmp, and no shell.
mkdir -p "$out/usr/lib64" "$out/etc/ssl/certs" "$out/tmp" "$out/home/nonroot" "$out/proc" "$out/dev"
ln -sfn usr/lib "$out/lib"
ln -sfn usr/lib64 "$out/lib64"
for package in libc6 libgcc-s1 libstdc++6 libssl3; do
  dpkg -L "$package" | grep -E '\.so(\.[0-9]+)*$' | while read -r file; do
    [ -e "$file" ] || continue
    directory="$(readlink -f "$(dirname "$file")")"
    mkdir -p "$out$directory"
    cp -L "$file" "$out$directory/$(basename "$file")"
  done
done
cp -L /etc/ssl/certs/ca-certificates.crt "$out/etc/ssl/certs/"
cat > "$out/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
cat > "$out/etc/group" <<'GROUP'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
GROUP
chmod 1777 "$out/tmp"
chown 65532:65532 "$out/home/nonroot" 2>/dev/null || true
chmod 0700 "$out/home/nonroot"
