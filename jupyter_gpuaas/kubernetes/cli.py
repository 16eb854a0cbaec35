"""`jupyter-gpuaas kubernetes manifests`: everything to deploy the gateway on a cluster.

Prints multi-document YAML for `kubectl apply -f -`. Bad input (a quota file that breaks
the format, a flavor the quota file does not name, a label that Kubernetes would refuse)
exits 2 with one line naming the flag and the problem.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

PROG = "jupyter-gpuaas kubernetes manifests"


def _pair(text: str, flag: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise ValueError(f"{flag} {text}: expected FLAVOR=VALUE")
    return name, value


def parse_selectors(items: list[str]) -> dict[str, dict[str, str]]:
    """`a100=nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB[,pool=gpu]` (repeatable)."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        flavor, rest = _pair(item, "--flavor-selector")
        selector = out.setdefault(flavor, {})
        for term in rest.split(","):
            key, sep, value = term.partition("=")
            if not sep or not key:
                raise ValueError(f"--flavor-selector {item}: {term!r} is not LABEL=VALUE")
            selector[key] = value
    return out


def add_flavor_arguments(parser: argparse.ArgumentParser, resource_default: str) -> None:
    """How a flavor's nodes are found and which resource counts their GPUs: the same two
    options for every command that writes Kubernetes objects for flavors."""
    parser.add_argument(
        "--flavor-selector",
        action="append",
        default=[],
        metavar="FLAVOR=LABEL=VALUE[,LABEL=VALUE]",
        help="the node labels of a flavor's nodes (default: gpuaas.jupyter.org/flavor=FLAVOR)",
    )
    parser.add_argument(
        "--flavor-resource",
        action="append",
        default=[],
        metavar="FLAVOR=RESOURCE",
        help=f"the extended resource of one flavor's GPUs (default: {resource_default})",
    )


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "kubernetes",
        help="deploy on Kubernetes: print the manifests of the gateway",
        description="Kubernetes deployment of the gateway.",
    )
    sub = parser.add_subparsers(dest="kubernetes_command", metavar="COMMAND")
    m = sub.add_parser(
        "manifests",
        help="print the gateway's manifests as multi-document YAML (for kubectl apply -f -)",
        description="Print ServiceAccount, RBAC, ConfigMap, Deployment, Service, "
        "PodDisruptionBudget and the scale-up objects for `kubectl apply -f -`.",
    )
    m.add_argument("--quotas", required=True, metavar="FILE", help="the quota file (YAML)")
    m.add_argument("--namespace", default="jhub", help="namespace of JupyterHub and the gateway")
    m.add_argument("--image", default="", help="the gateway's image (default: this version's)")
    m.add_argument(
        "--scale-up",
        default="keda",
        choices=("keda", "provisioning-request", "placeholders", "none"),
        help="how queued demand becomes new nodes (default: keda)",
    )
    m.add_argument(
        "--admission",
        default="core",
        choices=("core", "kueue"),
        help="who admits: the gateway's core (default) or the cluster's Kueue (Kueue mode: "
        "the gateway follows Workloads, and its RBAC lets it; docs/KUEUE.md)",
    )
    m.add_argument(
        "--singleuser-access",
        default="kernels",
        choices=("kernels", "kernels-and-jobs", "none"),
        help="what the users' servers (ServiceAccount jupyter-gpuaas-singleuser) may do: "
        "run GPU kernels in pods of their own (default), also run batch jobs as Kubernetes "
        "Jobs, or nothing",
    )
    add_flavor_arguments(m, "nvidia.com/gpu")
    m.add_argument("--hub-api-url", default="http://hub:8081/hub/api", help="the Hub's API")
    m.add_argument(
        "--prometheus-url",
        default="http://prometheus-server.monitoring.svc:80",
        help="the Prometheus that KEDA asks for gpuaas_desired_nodes",
    )
    m.add_argument(
        "--provisioning-class",
        default="check-capacity.autoscaling.x-k8s.io",
        help="ProvisioningRequest class (or best-effort-atomic-scale-up.autoscaling.x-k8s.io)",
    )
    m.set_defaults(run=run)

    def usage(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(run=usage)
    return parser


def run(args: argparse.Namespace) -> int:
    import yaml

    from jupyter_gpuaas.admission.config import SpecError, parse_config
    from jupyter_gpuaas.kubeapi.meta import ManifestError, Settings, cluster_flavors

    from .manifests import manifests

    def fail(message: str) -> int:
        print(f"{PROG}: {message}", file=sys.stderr)
        return 2

    try:
        with open(args.quotas, encoding="utf-8") as f:
            text = f.read()
        data = yaml.safe_load(text)
    except OSError as e:
        return fail(f"--quotas {args.quotas}: {e.strerror}")
    except yaml.YAMLError as e:
        return fail(f"--quotas {args.quotas}: not valid YAML ({' '.join(str(e).split())})")
    if not isinstance(data, dict):
        return fail(f"--quotas {args.quotas}: must be a mapping with flavors and tenants")
    try:
        config = parse_config(data)
    except SpecError as e:
        return fail(f"--quotas {args.quotas}: {e}")
    try:
        selectors = parse_selectors(args.flavor_selector)
        resources = dict(_pair(r, "--flavor-resource") for r in args.flavor_resource)
        flavors = cluster_flavors(config, selectors, resources)
        kw: dict[str, Any] = dict(
            namespace=args.namespace,
            scale_up=args.scale_up,
            admission=args.admission,
            hub_api_url=args.hub_api_url,
            prometheus_url=args.prometheus_url,
            provisioning_class=args.provisioning_class,
            singleuser_access=args.singleuser_access,
            quotas_text=text,
        )
        if args.image:
            kw["image"] = args.image
        docs = manifests(flavors, Settings(**kw))
    except (ManifestError, ValueError) as e:
        return fail(str(e))
    sys.stdout.write(to_yaml(docs))
    return 0


def to_yaml(docs: list[dict[str, Any]]) -> str:
    """Multi-document YAML; multi-line strings (the quota file) as literal blocks."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump_all(docs, Dumper=Dumper, sort_keys=False, explicit_start=True)
