"""Teams' Queues. `flotilla queues import` reads Kueue's ClusterQueues and Cohorts (kueue.x-k8s.io/v1beta2) from
the cluster in KUBECONFIG, or from YAML files with -f, and prints the equivalent Flotilla Queues as YAML; with
--apply it applies them (server-side apply). What has no equivalent is said on stderr, one line each. Queues
that would be refused (a cycle, children above their parent, two queues claiming a namespace) are reported on
stderr too, and then nothing is applied (exit 1)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Mapping

import yaml

from flotilla.queueimport import kueue

HELP = "Teams' Queues: import Kueue ClusterQueues and Cohorts"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
FIELD_MANAGER = "flotilla-queues-import"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    imp = sub.add_parser("import", help="print (or --apply) the Queues equivalent to Kueue's ClusterQueues and "
                                        "Cohorts", description=__doc__)
    imp.add_argument("-f", "--filename", type=Path, action="append", metavar="FILE",
                     help="read ClusterQueues and Cohorts from this YAML file (repeatable; - for stdin) instead "
                          "of the cluster")
    imp.add_argument("--apply", action="store_true", help="apply the Queues to the cluster in KUBECONFIG")


def read_files(paths: list[Path]) -> list[Mapping[str, Any]]:
    objects: list[Mapping[str, Any]] = []
    for path in paths:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
        for doc in yaml.safe_load_all(text):
            if isinstance(doc, Mapping) and doc.get("kind", "").endswith("List"):
                objects.extend(doc.get("items") or [])
            elif isinstance(doc, Mapping):
                objects.append(doc)
    return objects


def read_cluster(api: Any) -> tuple[list[Mapping[str, Any]], dict[str, dict[str, str]]]:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    objects: list[Mapping[str, Any]] = []
    for kind, plural in (("ClusterQueue", "clusterqueues"), ("Cohort", "cohorts")):
        try:
            listed: Any = custom.list_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural)
            items = listed["items"]
        except ApiException as e:
            if e.status == 404:
                raise SystemExit(f"error: the cluster serves no {plural}.{KUEUE_GROUP}/{KUEUE_VERSION} "
                                 "(Kueue v0.15 or later, with its v1beta2 API, is needed; or use -f FILE)") from None
            raise SystemExit(f"error: listing {plural}.{KUEUE_GROUP}: {e.status} {e.reason}") from None
        objects.extend({**item, "kind": kind} for item in items)
    namespaces: dict[str, dict[str, str]] = {}
    for ns in core.list_namespace().items:
        meta: Any = ns.metadata
        namespaces[str(meta.name)] = dict(meta.labels or {})
    return objects, namespaces


def apply(api: Any, queues: list[dict[str, Any]]) -> None:
    from kubernetes import client

    from flotilla import GROUP, VERSION

    custom = client.CustomObjectsApi(api)
    for q in queues:
        custom.patch_cluster_custom_object(GROUP, VERSION, "queues", q["metadata"]["name"], q,
                                           field_manager=FIELD_MANAGER, force=True,
                                           _content_type="application/apply-patch+yaml")
        print(f"queue.{GROUP}/{q['metadata']['name']} applied", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    api = None
    if args.filename:
        try:
            objects, labels = read_files(args.filename), None
        except (OSError, yaml.YAMLError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    else:
        from flotilla import kubeapi

        api = kubeapi.connect("flotilla-queues-import")
        objects, labels = read_cluster(api)
    found = kueue.translate(objects, labels)
    for note in found.notes:
        print(f"note: {note}", file=sys.stderr)
    queues = [kueue.queue_object(q) for q in found.queues]
    sys.stdout.write(yaml.safe_dump_all(queues, sort_keys=False) if queues else "")
    if not queues:
        print("no ClusterQueues or Cohorts found", file=sys.stderr)
    for p in found.problems:
        print(f"refused: Queue {p.queue}: {p.field}: {p.message}", file=sys.stderr)
    if found.problems:
        return 1
    if args.apply and queues:
        if api is None:
            from flotilla import kubeapi

            api = kubeapi.connect("flotilla-queues-import")
        apply(api, queues)
    return 0
