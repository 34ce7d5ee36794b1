"""Where a ServingDeployment's clients and routers reach its engines. Pure.

* A Service per pool (`<name>-prefill`, `<name>-decode`), on the engines' port (spec.endpoint.port,
  vLLM's 8000 by default). Clients go to the decode Service: as with llm-d's routing sidecar on decode
  pods, a decode instance calls a prefill instance first. The controller finds the engines it scrapes
  through the same Services (their EndpointSlices).
* Pods carry llm-d's role label (`llm-d.ai/role: prefill | decode`) and its inference-serving marker,
  so that the ecosystem's routers (the inference extension's endpoint picker with llm-d's P/D
  scheduler) can split the pool by role.
* An `InferencePool` (Gateway API Inference Extension, inference.networking.k8s.io/v1) selecting both
  pools' pods, when its CRD is installed: a gateway's HTTPRoute then points at it. Its endpoint picker
  is the user's (spec.endpoint.endpointPicker; default `<name>-epp`, port 9002): Flotilla chooses the
  pools' shape, the picker chooses the pod for each request.
"""

from __future__ import annotations

from typing import Any, Mapping

from flotilla import API_VERSION
from flotilla.resources import names

Body = Mapping[str, Any]
ROLES = (names.ROLE_PREFILL, names.ROLE_DECODE)


def port(body: Body) -> int:
    return int((body["spec"].get("endpoint") or {}).get("port") or names.ENGINE_PORT)


def pod_labels(role: str) -> dict[str, str]:
    """Labels the ecosystem's routers read, on every pod of the role's pool."""
    return {names.LABEL_LLMD_ROLE: role, names.LABEL_LLMD_INFERENCE_SERVING: "true"}


def _owner(body: Body) -> dict[str, Any]:
    meta = body["metadata"]
    return {"apiVersion": API_VERSION, "kind": "ServingDeployment", "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def service(body: Body, role: str) -> dict[str, Any]:
    meta = body["metadata"]
    selector = {names.LABEL_SERVING: meta["name"], names.LABEL_ROLE: role}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": names.service_name(meta["name"], role), "namespace": meta["namespace"],
                     "labels": {**selector, **pod_labels(role), names.LABEL_MANAGED_BY: names.MANAGED_BY},
                     "ownerReferences": [_owner(body)]},
        "spec": {"type": "ClusterIP", "selector": selector,
                 "ports": [{"name": "http", "port": port(body), "targetPort": port(body), "protocol": "TCP"}]},
    }


def inference_pool(body: Body) -> dict[str, Any]:
    meta = body["metadata"]
    picker = (body["spec"].get("endpoint") or {}).get("endpointPicker") or {}
    return {
        "apiVersion": f"{names.INFERENCE_POOL_GROUP}/{names.INFERENCE_POOL_VERSION}",
        "kind": "InferencePool",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                     "labels": {names.LABEL_SERVING: meta["name"], names.LABEL_MANAGED_BY: names.MANAGED_BY},
                     "ownerReferences": [_owner(body)]},
        "spec": {
            "selector": {"matchLabels": {names.LABEL_SERVING: meta["name"],
                                         names.LABEL_LLMD_INFERENCE_SERVING: "true"}},
            "targetPorts": [{"number": port(body)}],
            "endpointPickerRef": {"kind": "Service", "name": picker.get("name") or f"{meta['name']}-epp",
                                  "port": {"number": int(picker.get("port") or names.ENDPOINT_PICKER_PORT)}},
        },
    }


def url(body: Body) -> str:
    """status.endpoint: the decode Service's in-cluster address."""
    meta = body["metadata"]
    return f"http://{names.service_name(meta['name'], names.ROLE_DECODE)}.{meta['namespace']}.svc:{port(body)}"


def objects(body: Body, inference_pools: bool) -> list[dict[str, Any]]:
    """Everything that makes the endpoint, to be server-side applied."""
    out = [service(body, role) for role in ROLES]
    if inference_pools:
        out.append(inference_pool(body))
    return out
