#!/usr/bin/env bash
# Prints a directory to put on PYTHONPATH for the `kubernetes-validate`
# package (the Kubernetes API's JSON schemas, and jsonschema and PyYAML with
# it), installing it from PyPI into .tools/ if needed. Logs go to stderr;
# stdout is only the path.
set -euo pipefail

VERSION="${KUBERNETES_VALIDATE_VERSION:-1.37.0}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="$root/.tools/kubernetes-validate-$VERSION"
python="${PYTHON:-python3}"

probe() {
  PYTHONPATH="$prefix" "$python" -c 'import kubernetes_validate, jsonschema, yaml' >/dev/null 2>&1
}

if [[ ! -d "$prefix" ]] || ! probe; then
  echo "installing kubernetes-validate $VERSION (PyPI) into .tools/kubernetes-validate-$VERSION" >&2
  command -v "$python" >/dev/null || { echo "$python is needed" >&2; exit 1; }
  rm -rf "$prefix.part"
  "$python" -m pip install --quiet --disable-pip-version-check --no-input \
    --target "$prefix.part" "kubernetes-validate==$VERSION" pyyaml >&2
  rm -rf "$prefix"
  mv "$prefix.part" "$prefix"
  probe || { echo "kubernetes-validate does not import from $prefix" >&2; exit 1; }
fi

echo "$prefix"
