#!/usr/bin/env bash
# Makes a throwaway CA, a server certificate, a client (worker) certificate and two bearer
# tokens for local runs and tests, with openssl:
#
#   scripts/make-certs.sh DIR [NAME...]
#
# DIR/ca.pem          the CA (give it to clients as --tls_ca, and to the server as --tls_ca for mTLS)
# DIR/server.pem,key  the server's (--tls_cert, --tls_key); valid for localhost, 127.0.0.1 and
#                     each NAME (a DNS name, or an IP address), e.g. summa-server-0.summa-server
# DIR/client.pem,key  a worker's, for mutual TLS
# DIR/worker.token, DIR/admin.token   random bearer tokens (--token_file, --admin_token_file)
# Keys are unencrypted and valid for 30 days: for testing, not for production.
set -euo pipefail
if (($# < 1)) || [[ "$1" == -h || "$1" == --help ]]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit $(( $# < 1 ? 2 : 0 ))
fi
command -v openssl >/dev/null || { echo "make-certs: openssl is not installed (apt-get install openssl)" >&2; exit 1; }
dir=$1
shift
mkdir -p "$dir"
cd "$dir"
san="DNS:localhost,IP:127.0.0.1"
for name in "$@"; do
  if [[ "$name" =~ ^[0-9.]+$ ]]; then san+=",IP:$name"; else san+=",DNS:$name"; fi
done
quiet() { "$@" 2>/dev/null || { echo "make-certs: failed: $*" >&2; exit 1; }; }
quiet openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=summa test CA" \
  -keyout ca.key -out ca.pem
for who in server client; do
  cn=$([[ $who == server ]] && echo summa-server || echo summa-worker)
  quiet openssl req -newkey rsa:2048 -nodes -subj "/CN=$cn" -keyout "$who.key" -out "$who.csr"
  ext="$who.ext"
  if [[ $who == server ]]; then
    # clientAuth too: the shards other than 0 call shard 0 (--coordinator) with this certificate.
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" >"$ext"
  else
    printf 'subjectAltName=DNS:summa-worker\nextendedKeyUsage=clientAuth\n' >"$ext"
  fi
  quiet openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
    -extfile "$ext" -out "$who.pem"
  rm -f "$who.csr" "$ext"
done
openssl rand -hex 32 >worker.token
openssl rand -hex 32 >admin.token
chmod 600 ./*.key ./*.token
echo "make-certs: wrote ca.pem, server.pem/key (localhost, 127.0.0.1${*:+, $*}), client.pem/key, worker.token, admin.token in $dir"
