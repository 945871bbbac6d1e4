# Sourced by bench/peers.sh and scripts/instructions.sh (and scripts/ab.sh through ab-origin.sh): requests as apps
# send them (docs/performance.md#realistic-requests). The client sends 12 app-like headers (~700 bytes: wrk adds
# them when WRK_REALISTIC=1, see bench/wrk_report.lua) and every proxy injects a 1 KiB bearer token.
#
# realistic_token: prints the token, a fixed 1 KiB JWT-shaped string (letters, digits, dots: safe in every config
#   syntax), the same in every run.
# seed_realistic_keychain BIN CONFIG: creates the keychain CONFIG names (its `keychain:` section) and stores the
#   token as `bench/token`, for `auth: {type: static, entry: bench/token}`. Returns 1 when the binary refuses.
realistic_token() {
  python3 -c 'import hashlib; h="".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(16)); print("eyJhbGciOiJFUzI1NiJ9." + h[:900] + "." + h[900:1000])'
}

seed_realistic_keychain() {
  local bin=$1 config=$2
  "$bin" keychain init --config "$config" >/dev/null 2>&1 || return 1
  realistic_token | tr -d '\n' | "$bin" keychain set bench/token --config "$config" >/dev/null 2>&1 || return 1
}
