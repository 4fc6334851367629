"""Every rendered object against a schema, strictly (an unknown field is an error).

Kubernetes' own kinds: PyPI kubernetes-validate, which bundles the OpenAPI schemas of Kubernetes
1.25-1.37 with a strict variant (additionalProperties false everywhere), for KUBERNETES_VERSION.
The Prometheus operator's kinds (ServiceMonitor, PodMonitor) are not among them: they are read by
the pydantic models PyPI cloudcoil-models-prometheus-operator generates from the operator's CRDs,
and written back; anything the models dropped or changed (an unknown or misspelt field, a wrong
type) makes the object differ from what was rendered, which counts as an error the same way.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate

KUBERNETES_VERSION = "1.33"
OPERATOR_GROUP = "monitoring.coreos.com/"


def _operator_model(kind: str) -> Any:
    from cloudcoil.models.prometheus_operator import v1

    models = {"ServiceMonitor": v1.ServiceMonitor, "PodMonitor": v1.PodMonitor}
    if kind not in models:
        raise AssertionError(f"no schema for {OPERATOR_GROUP}{kind}")
    return models[kind]


def schema_errors(manifest: dict[str, Any]) -> list[str]:
    """What is wrong with one object ([] when it validates)."""
    name = f"{manifest.get('kind')}/{manifest.get('metadata', {}).get('name')}"
    if str(manifest.get("apiVersion", "")).startswith(OPERATOR_GROUP):
        model = _operator_model(str(manifest["kind"]))
        try:
            parsed = model.model_validate(manifest)
        except ValueError as error:
            return [f"{name}: {error}"]
        again = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
        return [] if again == manifest else [f"{name}: fields the operator's schema does not know: {_diff(manifest, again)}"]
    try:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(part) for part in error.path)
        return [f"{name}: {where}: {error.message}"]
    except kubernetes_validate.SchemaNotFoundError as error:
        return [f"{name}: {error.message}"]
    return []


def _diff(left: Any, right: Any, path: str = "") -> list[str]:
    if isinstance(left, dict) and isinstance(right, dict):
        out: list[str] = []
        for key in sorted(set(left) | set(right)):
            out += _diff(left.get(key), right.get(key), f"{path}.{key}" if path else key)
        return out
    if isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
        return [d for i, (a, b) in enumerate(zip(left, right, strict=True)) for d in _diff(a, b, f"{path}[{i}]")]
    return [] if left == right else [path]
