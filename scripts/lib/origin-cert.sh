# Sourced by the benchmark scripts (bench/*.sh, scripts/ab.sh, scripts/instructions.sh): the one way they make TLS
# material for a test origin.
#
# make_origin_cert DIR SAN [CN]
#   A CA made for the run (DIR/ca.pem, DIR/ca.key) and an origin certificate it signs (DIR/origin.pem,
#   DIR/origin.key) for SAN, e.g. "IP:127.0.0.1" or "DNS:localhost,IP:127.0.0.1". ECDSA P-256, valid two days;
#   certificates and the origin key world-readable for servers that drop privileges. Returns 1 when openssl fails.
make_origin_cert() {
  local dir=$1 san=$2 cn=${3:-127.0.0.1}
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=backstop bench CA" \
    -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null || return 1
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$cn" \
    -keyout "$dir/origin.key" -out "$dir/origin.csr" 2>/dev/null || return 1
  printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$san" > "$dir/origin.ext"
  openssl x509 -req -in "$dir/origin.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial -days 2 \
    -extfile "$dir/origin.ext" -out "$dir/origin.pem" 2>/dev/null || return 1
  chmod 644 "$dir/ca.pem" "$dir/origin.pem" "$dir/origin.key"
}
