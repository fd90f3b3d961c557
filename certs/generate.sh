#!/usr/bin/env bash
# Creates a private CA and an ECDSA P-256 serving certificate for the webhook (or, with --service, another
# gpuguard Service in gpuguard-system, such as gpuguard-scheduler-extender).
#   certs/generate.sh [--out DIR] [--service NAME] [--days N] [--force] [--new-ca]
# Writes DIR/ca.crt, DIR/ca.key, DIR/tls.crt, DIR/tls.key (default DIR: certs/dev). Idempotent: an existing
# pair that verifies against the CA, matches its key and stays valid for 30 more days is kept unless --force,
# which issues a new serving pair from the existing CA (a rotation clients need not hear about); --new-ca
# replaces the CA as well. A pair issued for another service name is replaced.
set -euo pipefail

out="$(cd "$(dirname "$0")" && pwd)/dev"
days=365
force=0
new_ca=0
service=gpuguard-webhook
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --days) days="$2"; shift 2 ;;
    --service) service="$2"; shift 2 ;;
    --force) force=1; shift ;;
    --new-ca) force=1; new_ca=1; shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "generate.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

case "$service" in
  ""|*[!a-z0-9-]*) echo "generate.sh: --service must be a DNS label (a-z, 0-9, -)" >&2; exit 2 ;;
esac
namespace=gpuguard-system
sans="DNS:localhost,IP:127.0.0.1,DNS:${service},DNS:${service}.${namespace},DNS:${service}.${namespace}.svc,DNS:${service}.${namespace}.svc.cluster.local"

mkdir -p "$out"
cd "$out"

valid_pair() {
  [ -s ca.crt ] && [ -s tls.crt ] && [ -s tls.key ] || return 1
  openssl verify -CAfile ca.crt -verify_hostname "${service}.${namespace}.svc" tls.crt >/dev/null 2>&1 || return 1
  openssl x509 -in tls.crt -noout -checkend $((30 * 24 * 3600)) >/dev/null 2>&1 || return 1
  [ "$(openssl x509 -in tls.crt -noout -pubkey | openssl pkey -pubin -outform DER 2>/dev/null | sha256sum)" = \
    "$(openssl pkey -in tls.key -pubout -outform DER 2>/dev/null | sha256sum)" ]
}

valid_ca() {
  [ -s ca.crt ] && [ -s ca.key ] || return 1
  openssl x509 -in ca.crt -noout -checkend $((90 * 24 * 3600)) >/dev/null 2>&1 || return 1
  [ "$(openssl x509 -in ca.crt -noout -pubkey | openssl pkey -pubin -outform DER 2>/dev/null | sha256sum)" = \
    "$(openssl pkey -in ca.key -pubout -outform DER 2>/dev/null | sha256sum)" ]
}

if [ "$force" -eq 0 ] && valid_pair; then
  echo "generate.sh: keeping the valid pair in $out (use --force to replace it)"
else
  umask 077
  if [ "$new_ca" -eq 0 ] && valid_ca; then
    cp ca.key ca.key.new && cp ca.crt ca.crt.new
    ca_state="existing CA"
  else
    ca_state="new CA"
    openssl ecparam -name prime256v1 -genkey -noout -out ca.key.new 2>/dev/null
    openssl req -x509 -new -key ca.key.new -sha256 -days $((days * 5)) -subj "/CN=gpuguard-dev-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -out ca.crt.new
  fi
  openssl ecparam -name prime256v1 -genkey -noout -out tls.key.new 2>/dev/null
  openssl req -new -key tls.key.new -subj "/CN=${service}.${namespace}.svc" -out tls.csr
  openssl x509 -req -in tls.csr -CA ca.crt.new -CAkey ca.key.new -set_serial "0x$(openssl rand -hex 16)" -sha256 -days "$days" \
    -extfile <(printf 'subjectAltName=%s\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' "$sans") \
    -out tls.crt.new 2>/dev/null
  rm -f tls.csr
  # Rename last, so that a failure above never leaves a half-written pair behind.
  mv ca.key.new ca.key && mv ca.crt.new ca.crt && mv tls.key.new tls.key && mv tls.crt.new tls.crt
  chmod 644 ca.crt tls.crt
  echo "generate.sh: wrote a serving certificate to $out (${ca_state})"
fi
echo "generate.sh: tls.crt valid until $(openssl x509 -in tls.crt -noout -enddate | cut -d= -f2)"
