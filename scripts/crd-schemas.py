#!/usr/bin/env python3
"""Writes the openAPIV3Schema of chosen CRDs as JSON files, one per kind and
version, without descriptions (validation does not read them).

    scripts/crd-schemas.py --out deploy/schemas CRD.yaml... -- KIND...

deploy/schemas/README.md says where the CRD files came from.
"""
import argparse
import json
import os
import sys

import yaml


def strip(node):
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main():
    args = sys.argv[1:]
    if "--" not in args:
        sys.exit("usage: crd-schemas.py --out DIR CRD.yaml... -- KIND...")
    split = args.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("files", nargs="+")
    opts = parser.parse_args(args[:split])
    kinds = set(args[split + 1:])
    written = set()
    for path in opts.files:
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if not doc or doc.get("kind") != "CustomResourceDefinition":
                    continue
                spec = doc["spec"]
                kind = spec["names"]["kind"]
                if kind not in kinds:
                    continue
                for version in spec["versions"]:
                    schema = version.get("schema", {}).get("openAPIV3Schema")
                    if schema is None:
                        continue
                    name = f"{spec['group']}_{kind}_{version['name']}.json".lower()
                    with open(os.path.join(opts.out, name), "w") as out:
                        json.dump(strip(schema), out, indent=1, sort_keys=True)
                        out.write("\n")
                    written.add(kind)
    missing = kinds - written
    if missing:
        sys.exit(f"no CRD for {sorted(missing)}")


if __name__ == "__main__":
    main()
