#!/usr/bin/env bash
# Checks that the Dockerfile's runtime stage installs exactly the Debian packages that provide the shared
# libraries the backstop binary links (besides glibc). Libraries under the Swift toolchain are linked statically
# in the image (--static-swift-stdlib) and are listed as such.
#   bash scripts/check-runtime-deps.sh [BINARY]      (default .build/release/backstop)
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:-.build/release/backstop}
[ -x "$binary" ] || { echo "no binary at $binary (bash scripts/build-release.sh --product backstop)" >&2; exit 2; }

installed=$(awk '/^FROM debian/{runtime=1} runtime && /apt-get install/{for(i=1;i<=NF;i++) if ($i !~ /^-/ && $i != "apt-get" && $i != "install" && $i != "&&" && $i != "\\") print $i}' Dockerfile | sort -u)
glibc="libc6"
missing=0
needed=""
printf '%-38s %-18s %s\n' LIBRARY PACKAGE "INSTALLED BY DOCKERFILE"
# Direct dependencies only (readelf NEEDED): transitive ones come with the packages that need them.
for lib in $(readelf -d "$binary" | awk '/NEEDED/{gsub(/[\[\]]/,"",$5); print $5}'); do
    path=$(ldd "$binary" | awk -v l="$lib" '$1==l{print $3}')
    case "$lib" in
        ld-linux*) printf '%-38s %-18s %s\n' "$lib" "libc6" "base image"; continue ;;
    esac
    case "$path" in
        /opt/swift/*|*/swift/linux/*) printf '%-38s %-18s %s\n' "$lib" "(Swift runtime)" "static (--static-swift-stdlib)"; continue ;;
    esac
    pkg=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | head -1 | cut -d: -f1 || true)
    [ -n "$pkg" ] || pkg=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1 || true)
    if [ "$pkg" = "$glibc" ] || [ "$pkg" = "libgcc-s1" ] || [ "$pkg" = "libstdc++6" ]; then
        printf '%-38s %-18s %s\n' "$lib" "$pkg" "base image"
    elif echo "$installed" | grep -qx "$pkg"; then
        printf '%-38s %-18s %s\n' "$lib" "$pkg" "yes"
        needed="$needed $pkg"
    else
        printf '%-38s %-18s %s\n' "$lib" "${pkg:-unknown}" "MISSING"
        missing=1
    fi
done
# ca-certificates (TLS) and publicsuffix (`check` of intercepting hosts) are data, not libraries; every other
# installed package must be one found above.
for pkg in $installed; do
    [ "$pkg" = ca-certificates ] && continue
    [ "$pkg" = publicsuffix ] && continue
    if ! echo "$needed" | tr ' ' '\n' | grep -qx "$pkg"; then
        echo "installed but not needed: $pkg"
        missing=1
    fi
done
echo
echo "Swift runtime (/opt/swift/...): this local build links it dynamically; the Docker build links it into the"
echo "binary (scripts/build-release.sh: --static-swift-stdlib), so the runtime image needs none of it."
echo "base image: glibc, libstdc++6 and libgcc-s1 are already in debian:bookworm-slim."
echo "runtime stage installs: $(echo $installed)"
if [ "$missing" -ne 0 ]; then
    echo "check-runtime-deps: FAILED (a needed package is not installed, or an installed one is not needed)"
else
    echo "check-runtime-deps: ok"
fi
exit $missing
