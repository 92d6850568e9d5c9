#!/usr/bin/env bash
# Prints the path of a redis-server to run, installing one if needed. Order:
# $REDIS_SERVER, then the project-local copy in .tools/ (Debian's packages,
# unpacked without root). Logs go to stderr; stdout is only the path.
set -euo pipefail

REDIS_VERSION="${REDIS_VERSION:-7.0.15}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="$root/.tools/redis-$REDIS_VERSION"
wrapper="$prefix/bin/redis-server"

if [[ -n "${REDIS_SERVER:-}" ]]; then
  [[ -x "$REDIS_SERVER" ]] || { echo "REDIS_SERVER=$REDIS_SERVER is not an executable" >&2; exit 1; }
  echo "$REDIS_SERVER"
  exit 0
fi

# A wrapper runs the unpacked binary with the unpacked libraries (liblzf,
# jemalloc) ahead of the system's.
write_wrapper() {
  local name="$1" target="$2"
  cat >"$prefix/bin/$name.part" <<EOF
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$prefix/root/usr/lib/x86_64-linux-gnu:$prefix/root/usr/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$prefix/root/usr/bin/$target" "\$@"
EOF
  chmod 755 "$prefix/bin/$name.part"
  mv "$prefix/bin/$name.part" "$prefix/bin/$name"
}

if [[ ! -x "$wrapper" ]] || ! "$wrapper" --version >/dev/null 2>&1; then
  echo "installing redis-server (Debian packages) into .tools/redis-$REDIS_VERSION" >&2
  command -v apt-get >/dev/null || { echo "apt-get is needed to fetch Redis; or set REDIS_SERVER" >&2; exit 1; }
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download redis-server redis-tools liblzf1 libjemalloc2 </dev/null >&2)
  rm -rf "$prefix"
  mkdir -p "$prefix/root" "$prefix/bin"
  for deb in "$tmp"/*.deb; do
    dpkg -x "$deb" "$prefix/root"
  done
  # Debian's redis-server is a link to redis-check-rdb: the binary picks its
  # role from the name it is run by, so the wrapper runs the link.
  write_wrapper redis-server redis-server
  write_wrapper redis-cli redis-cli
fi

version="$("$wrapper" --version)" || { echo "$wrapper does not run" >&2; exit 1; }
echo "$version" >&2
echo "$wrapper"
