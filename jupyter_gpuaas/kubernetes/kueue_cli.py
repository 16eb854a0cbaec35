"""`jupyter-gpuaas kueue manifests` and `kueue import`: the quota file as Kueue's objects
and back, so one quota format serves our core and a cluster's Kueue.

`manifests` prints multi-document YAML for `kubectl apply -f -`; `import` reads our output
or `kubectl get resourceflavors,cohorts,clusterqueues,localqueues -A -o yaml` and prints a
quota file that `simulate` and the gateway's `--quotas` take. Bad input exits 2 with one
line naming the file, the object and the field.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .cli import add_flavor_arguments

PROG = "jupyter-gpuaas kueue"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "kueue",
        help="the quota file as Kueue's objects, and back",
        description="Translate between the quota file and Kueue's ResourceFlavor, Cohort, "
        "ClusterQueue and LocalQueue objects (kueue.x-k8s.io/v1beta2).",
    )
    sub = parser.add_subparsers(dest="kueue_command", metavar="COMMAND")
    m = sub.add_parser(
        "manifests",
        help="print the quota file as Kueue's objects (for kubectl apply -f -)",
        description="Print a ResourceFlavor per flavor, a Cohort per declared cohort, a "
        "ClusterQueue per tenant and a LocalQueue per tenant in NAMESPACE, as "
        "multi-document YAML.",
    )
    m.add_argument("quotas", metavar="QUOTAS", help="the quota file (YAML)")
    m.add_argument(
        "--namespace", default="jhub", help="namespace of the users' pods (default: jhub)"
    )
    m.add_argument(
        "--resource",
        default="nvidia.com/gpu",
        help="the extended resource of the flavors' GPUs (default: nvidia.com/gpu)",
    )
    add_flavor_arguments(m, "--resource")
    m.set_defaults(run=run_manifests)
    i = sub.add_parser(
        "import",
        help="read Kueue's objects back into a quota file",
        description="Read ResourceFlavors, Cohorts, ClusterQueues and LocalQueues (our "
        "manifests, or kubectl get -o yaml) and print the quota file they make.",
    )
    i.add_argument("files", nargs="+", metavar="FILE", help="YAML files ('-': standard input)")
    i.set_defaults(run=run_import)

    def usage(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(run=usage)
    return parser


def _fail(command: str, message: str) -> int:
    print(f"{PROG} {command}: {message}", file=sys.stderr)
    return 2


def run_manifests(args: argparse.Namespace) -> int:
    import yaml

    from jupyter_gpuaas.admission.config import SpecError, parse_config

    from ..kubeapi.meta import ManifestError, cluster_flavors
    from .cli import _pair, parse_selectors, to_yaml
    from .kueue import manifests

    try:
        with open(args.quotas, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        return _fail("manifests", f"{args.quotas}: {e.strerror}")
    except yaml.YAMLError as e:
        return _fail("manifests", f"{args.quotas}: not valid YAML ({' '.join(str(e).split())})")
    if not isinstance(data, dict):
        return _fail("manifests", f"{args.quotas}: must be a mapping with flavors and tenants")
    # A scenario is a quota file with requests: take its quota part.
    quota = {k: v for k, v in data.items() if k in ("flavors", "cohorts", "tenants", "policy")}
    try:
        config = parse_config(quota)
    except SpecError as e:
        return _fail("manifests", f"{args.quotas}: {e}")
    try:
        selectors = parse_selectors(args.flavor_selector)
        resources = dict(_pair(r, "--flavor-resource") for r in args.flavor_resource)
        for name in config.flavors:
            resources.setdefault(name, args.resource)
        flavors = cluster_flavors(config, selectors, resources)
        docs = manifests(config, flavors, args.namespace)
    except (ManifestError, ValueError) as e:
        return _fail("manifests", str(e))
    sys.stdout.write(to_yaml(docs))
    return 0


def run_import(args: argparse.Namespace) -> int:
    import yaml

    from jupyter_gpuaas.admission.config import SpecError, parse_config

    from .kueue_import import KueueImportError, flatten, import_objects

    objects: list[Any] = []
    for name in args.files:
        try:
            if name == "-":
                docs = list(yaml.safe_load_all(sys.stdin))
            else:
                with open(name, encoding="utf-8") as f:
                    docs = list(yaml.safe_load_all(f))
            objects.extend(flatten(docs, name))
        except OSError as e:
            return _fail("import", f"{name}: {e.strerror}")
        except yaml.YAMLError as e:
            return _fail("import", f"{name}: not valid YAML ({' '.join(str(e).split())})")
        except KueueImportError as e:
            return _fail("import", str(e))
    if not objects:
        files = ", ".join(args.files)
        return _fail("import", f"{files}: no ResourceFlavor, Cohort, ClusterQueue or LocalQueue")
    warnings: list[str] = []
    try:
        data = import_objects(objects, warnings)
        parse_config(data)
    except KueueImportError as e:
        return _fail("import", str(e))
    except SpecError as e:
        return _fail("import", f"the quota file they make: {e}")
    for line in warnings:
        print(f"{PROG} import: warning: {line}", file=sys.stderr)
    sys.stdout.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100))
    return 0
