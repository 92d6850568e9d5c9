#!/usr/bin/env python3
"""Validates Kubernetes manifests offline.

    PYTHONPATH="$(scripts/ensure-kubernetes-validate.sh)" \
      scripts/validate-manifests.py [--schemas deploy/schemas] FILE_OR_DIR...

Every document of every YAML file (directories are walked; kustomization.yaml
files are checked to list files that exist, not validated as objects) is
validated strictly (unknown fields are errors) against the Kubernetes API's
schemas from the kubernetes-validate package, or, for a custom resource,
against its CRD's openAPIV3Schema in --schemas (files named
`<group>_<kind>_<version>.json`, lower case). A kind with no schema is an
error. Prints one line per document and exits 1 if any is invalid, naming
file, document, field and reason.
"""
import argparse
import json
import os
import sys

import jsonschema
import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.33.0"
CORE_GROUPS = {"", "apps", "policy", "networking.k8s.io", "batch", "rbac.authorization.k8s.io", "autoscaling"}


def files_under(paths):
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs.sort()
                for name in sorted(names):
                    if name.endswith((".yaml", ".yml")):
                        yield os.path.join(root, name)
        else:
            yield path


def field_path(error):
    return ".".join(str(p) for p in error.absolute_path) or "(document)"


def crd_schema(schemas, api_version, kind):
    group, _, version = api_version.rpartition("/")
    path = os.path.join(schemas, f"{group}_{kind}_{version}.json".lower())
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def strict(schema):
    """CRD schemas allow unknown fields only where they say so
    (x-kubernetes-preserve-unknown-fields); the API server prunes others, so
    a misspelt field would silently vanish: here it is an error."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def check_kustomization(path, doc):
    errors = []
    base = os.path.dirname(path)
    for entry in doc.get("resources", []) or []:
        target = os.path.join(base, entry)
        if not (os.path.isfile(target) or os.path.isfile(os.path.join(target, "kustomization.yaml"))):
            errors.append(f"resources: {entry} does not exist")
    return errors


def validate_document(doc, schemas):
    api_version = doc.get("apiVersion", "")
    kind = doc.get("kind", "")
    if not api_version or not kind:
        return ["apiVersion and kind are required"]
    group = api_version.rpartition("/")[0]
    if group in CORE_GROUPS:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            return [f"{field_path(err)}: {err.message}"]
        except kubernetes_validate.SchemaNotFoundError:
            return [f"no Kubernetes {KUBERNETES_VERSION} schema for {api_version} {kind}"]
        return []
    schema = crd_schema(schemas, api_version, kind)
    if schema is None:
        return [f"no CRD schema for {api_version} {kind} in {schemas}"]
    schema = strict(schema)
    # The API server itself checks these three on every object.
    schema.setdefault("properties", {}).update(
        {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}}
    )
    validator = jsonschema.Draft7Validator(schema)
    return [f"{field_path(e)}: {e.message}" for e in sorted(validator.iter_errors(doc), key=str)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--schemas", default=os.path.join(os.path.dirname(__file__), "..", "deploy", "schemas"))
    parser.add_argument("paths", nargs="+")
    opts = parser.parse_args()
    failed = 0
    checked = 0
    for path in files_under(opts.paths):
        with open(path) as f:
            try:
                docs = list(yaml.safe_load_all(f))
            except yaml.YAMLError as err:
                print(f"{path}: not YAML: {err}")
                failed += 1
                continue
        for index, doc in enumerate(docs):
            if doc is None:
                continue
            where = f"{path} document {index + 1} ({doc.get('kind', '?')} {doc.get('metadata', {}).get('name', '?')})"
            if os.path.basename(path) == "kustomization.yaml":
                errors = check_kustomization(path, doc)
            else:
                errors = validate_document(doc, opts.schemas)
            checked += 1
            if errors:
                failed += 1
                for error in errors:
                    print(f"{where}: INVALID: {error}")
            else:
                print(f"{where}: ok")
    print(f"{checked - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
