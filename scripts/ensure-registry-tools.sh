#!/usr/bin/env bash
# Prints a directory holding `docker-registry` (a real OCI registry,
# distribution 2.8, run as a normal process) and `skopeo` (copies and
# inspects images without a daemon), installing Debian's packages into
# .tools/ without root if needed, as ensure-redis.sh does. Logs go to
# stderr; stdout is only the path.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="$root/.tools/registry-tools"
bin="$prefix/bin"

probe() {
  "$bin/docker-registry" --version >/dev/null 2>&1 && "$bin/skopeo" --version >/dev/null 2>&1
}

if [[ ! -d "$bin" ]] || ! probe; then
  echo "installing docker-registry and skopeo (Debian packages) into .tools/registry-tools" >&2
  command -v apt-get >/dev/null || { echo "apt-get is needed to fetch docker-registry and skopeo" >&2; exit 1; }
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download docker-registry skopeo golang-github-containers-common \
    libgpgme11 libassuan0 libgpg-error0 libdevmapper1.02.1 </dev/null >&2)
  rm -rf "$prefix"
  mkdir -p "$prefix/root" "$bin"
  for deb in "$tmp"/*.deb; do
    dpkg -x "$deb" "$prefix/root"
  done
  libs="$prefix/root/usr/lib/x86_64-linux-gnu:$prefix/root/lib/x86_64-linux-gnu"
  # Accept any image: the tests push and pull their own images on loopback.
  printf '{"default": [{"type": "insecureAcceptAnything"}]}\n' >"$prefix/policy.json"
  : >"$prefix/registries.conf"
  cat >"$bin/skopeo.part" <<WRAPPER
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export CONTAINERS_REGISTRIES_CONF="$prefix/registries.conf"
exec "$prefix/root/usr/bin/skopeo" --policy "$prefix/policy.json" "\$@"
WRAPPER
  cat >"$bin/docker-registry.part" <<WRAPPER
#!/usr/bin/env bash
exec "$prefix/root/usr/bin/docker-registry" "\$@"
WRAPPER
  chmod 755 "$bin/skopeo.part" "$bin/docker-registry.part"
  mv "$bin/skopeo.part" "$bin/skopeo"
  mv "$bin/docker-registry.part" "$bin/docker-registry"
  probe || { echo "docker-registry or skopeo does not run from $bin" >&2; exit 1; }
fi

echo "$("$bin/skopeo" --version); $("$bin/docker-registry" --version)" >&2
echo "$bin"
