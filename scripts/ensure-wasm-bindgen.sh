#!/usr/bin/env bash
# Prints the path of a wasm-bindgen-test-runner whose version matches the
# wasm-bindgen crate in Cargo.lock (the two must agree), installing it into
# .tools/ with cargo if needed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3; exit }' "$root/Cargo.lock")"
[[ -n "$version" ]] || { echo "wasm-bindgen is not in Cargo.lock" >&2; exit 1; }
dest="$root/.tools/wasm-bindgen-$version"
if [[ ! -x "$dest/bin/wasm-bindgen-test-runner" ]]; then
  echo "installing wasm-bindgen-cli $version into .tools/" >&2
  # Prefer the versions wasm-bindgen-cli was released with; fall back to a
  # fresh resolution when the registry no longer serves one of them.
  if ! cargo install --quiet --locked wasm-bindgen-cli --version "$version" --root "$dest" 2>/dev/null; then
    echo "its locked dependencies are not all available; resolving them afresh" >&2
    cargo install --quiet wasm-bindgen-cli --version "$version" --root "$dest" >&2
  fi
fi
echo "$dest/bin/wasm-bindgen-test-runner"
