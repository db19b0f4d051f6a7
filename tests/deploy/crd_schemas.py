"""JSON schemas for the custom resources in k8s/ (kubernetes-validate ships only built-ins).

They cover exactly the fields the manifests use, closed with additionalProperties: false, so
a typo fails; the shapes follow monitoring.coreos.com/v1 ServiceMonitor and PrometheusRule and
keda.sh/v1alpha1 ScaledObject.
"""

from __future__ import annotations

from typing import Any

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
}
_DURATION = {"type": "string", "pattern": "^([0-9]+(ms|s|m|h))+$"}


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
    }


SERVICE_MONITOR = _resource(
    "monitoring.coreos.com/v1",
    "ServiceMonitor",
    {
        "type": "object",
        "required": ["selector", "endpoints"],
        "additionalProperties": False,
        "properties": {
            "selector": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"matchLabels": _STRING_MAP},
            },
            "namespaceSelector": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
            },
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["port"],
                    "additionalProperties": False,
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string", "pattern": "^/"},
                        "interval": _DURATION,
                        "scrapeTimeout": _DURATION,
                        "relabelings": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["targetLabel"],
                                "additionalProperties": False,
                                "properties": {
                                    "sourceLabels": {"type": "array", "items": {"type": "string"}},
                                    "targetLabel": {"type": "string"},
                                    "regex": {"type": "string"},
                                    "replacement": {"type": "string"},
                                    "action": {"enum": ["replace", "keep", "drop"]},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
)

PROMETHEUS_RULE = _resource(
    "monitoring.coreos.com/v1",
    "PrometheusRule",
    {
        "type": "object",
        "required": ["groups"],
        "additionalProperties": False,
        "properties": {
            "groups": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["name", "rules"],
                    "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "interval": _DURATION,
                        "rules": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "type": "object",
                                "required": ["expr"],
                                "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                "additionalProperties": False,
                                "properties": {
                                    "alert": {"type": "string", "minLength": 1},
                                    "record": {"type": "string", "minLength": 1},
                                    "expr": {"type": "string", "minLength": 1},
                                    "for": _DURATION,
                                    "labels": _STRING_MAP,
                                    "annotations": _STRING_MAP,
                                },
                            },
                        },
                    },
                },
            }
        },
    },
)

_HPA_POLICY = {
    "type": "object",
    "required": ["type", "value", "periodSeconds"],
    "additionalProperties": False,
    "properties": {
        "type": {"enum": ["Pods", "Percent"]},
        "value": {"type": "integer", "minimum": 1},
        "periodSeconds": {"type": "integer", "minimum": 1, "maximum": 1800},
    },
}
_HPA_RULES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {"type": "array", "items": _HPA_POLICY},
    },
}

SCALED_OBJECT = _resource(
    "keda.sh/v1alpha1",
    "ScaledObject",
    {
        "type": "object",
        "required": ["scaleTargetRef", "triggers"],
        "additionalProperties": False,
        "properties": {
            "scaleTargetRef": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "name": {"type": "string"},
                },
            },
            "minReplicaCount": {"type": "integer", "minimum": 0},
            "maxReplicaCount": {"type": "integer", "minimum": 1},
            "pollingInterval": {"type": "integer", "minimum": 1},
            "cooldownPeriod": {"type": "integer", "minimum": 0},
            "advanced": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "horizontalPodAutoscalerConfig": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "behavior": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {"scaleUp": _HPA_RULES, "scaleDown": _HPA_RULES},
                            },
                        },
                    }
                },
            },
            "triggers": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["type", "metadata"],
                    "additionalProperties": False,
                    "properties": {
                        "type": {"const": "prometheus"},
                        "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                        # KEDA reads every trigger metadata value as a string.
                        "metadata": {
                            "type": "object",
                            "required": ["serverAddress", "query", "threshold"],
                            "additionalProperties": {"type": "string"},
                        },
                    },
                },
            },
        },
    },
)

CRD_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
    ("keda.sh/v1alpha1", "ScaledObject"): SCALED_OBJECT,
}
