#!/usr/bin/env bash
# certs/generate.sh: an ECDSA P-256 pair for the in-cluster names, idempotent, rotating under the same CA.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

first=$("$root/certs/generate.sh" --out "$out")
echo "$first" | grep -q "tls.crt valid until" || fail "expiry not printed"
openssl verify -CAfile "$out/ca.crt" "$out/tls.crt" >/dev/null || fail "serving certificate does not chain to the CA"
openssl pkey -in "$out/tls.key" -noout -text | grep -q "ASN1 OID: prime256v1" || fail "key is not ECDSA P-256"
openssl pkey -in "$out/ca.key" -noout -text | grep -q "ASN1 OID: prime256v1" || fail "CA key is not ECDSA P-256"
sans=$(openssl x509 -in "$out/tls.crt" -noout -ext subjectAltName)
for san in DNS:localhost "IP Address:127.0.0.1" DNS:gpuguard-webhook.gpuguard-system.svc \
           DNS:gpuguard-webhook.gpuguard-system.svc.cluster.local; do
  echo "$sans" | grep -q "$san" || fail "missing SAN $san"
done
openssl x509 -in "$out/tls.crt" -noout -ext extendedKeyUsage | grep -q "TLS Web Server Authentication" || fail "no serverAuth"
[ "$(stat -c %a "$out/tls.key")" = 600 ] || fail "tls.key is readable by others"

before=$(sha256sum "$out"/*)
second=$("$root/certs/generate.sh" --out "$out")
echo "$second" | grep -q "keeping the valid pair" || fail "a valid pair was not kept"
[ "$(sha256sum "$out"/*)" = "$before" ] || fail "files changed on a second run"

serial=$(openssl x509 -in "$out/tls.crt" -noout -serial)
ca=$(sha256sum < "$out/ca.crt")
"$root/certs/generate.sh" --out "$out" --force >/dev/null
[ "$(openssl x509 -in "$out/tls.crt" -noout -serial)" != "$serial" ] || fail "--force did not issue a new certificate"
[ "$(sha256sum < "$out/ca.crt")" = "$ca" ] || fail "--force replaced the CA"
openssl verify -CAfile "$out/ca.crt" "$out/tls.crt" >/dev/null || fail "rotated certificate does not chain to the CA"
"$root/certs/generate.sh" --out "$out" --new-ca >/dev/null
[ "$(sha256sum < "$out/ca.crt")" != "$ca" ] || fail "--new-ca kept the CA"

# --service: a pair for another Service; the webhook's pair is not kept for it.
"$root/certs/generate.sh" --out "$out" --service gpuguard-scheduler-extender >/dev/null
openssl verify -CAfile "$out/ca.crt" -verify_hostname gpuguard-scheduler-extender.gpuguard-system.svc "$out/tls.crt" >/dev/null \
  || fail "--service did not issue a certificate for that Service"
if openssl verify -CAfile "$out/ca.crt" -verify_hostname gpuguard-webhook.gpuguard-system.svc "$out/tls.crt" >/dev/null 2>&1; then
  fail "the extender's certificate is also valid for the webhook"
fi

set +e
"$root/certs/generate.sh" --out "$out" --service 'Not_A_Label' >/dev/null 2>&1
[ $? -eq 2 ] || fail "an invalid --service was not refused"
"$root/certs/generate.sh" --bogus >/dev/null 2>&1
[ $? -eq 2 ] || fail "an unknown argument was not refused"
echo "certs/generate.sh: P-256, SANs, idempotence, rotation under the same CA, --service: all hold"
