"""A small, strict stand-in for `kustomize build`, enough for the kustomizations in k8s/.

No kustomize or kubectl binary exists offline, so the tests render overlays with this:
`resources` (files, or directories holding a kustomization.yaml), `namespace`, `images`
(name -> newName / newTag), `patches` given by `path` (strategic merge, including
`$patch: delete`) and `configMapGenerator` from `files` (with `options` labels, annotations
and `disableNameSuffixHash: true`; like kustomize, only files inside the kustomization's
directory). Any other key or option raises, so nothing is silently skipped.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED_KEYS = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "images",
    "patches",
    "configMapGenerator",
}
GENERATOR_KEYS = {"name", "files", "options"}
GENERATOR_OPTIONS = {"labels", "annotations", "disableNameSuffixHash"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
# Strategic-merge keys of the lists these manifests patch (Kubernetes' patchMergeKey).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}

Doc = dict[str, Any]


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_docs(path: Path) -> list[Doc]:
    """Every non-empty YAML document of a file."""
    return [d for d in yaml.load_all(path.read_text(), Loader=_Loader) if d]


def object_key(doc: Doc) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace", "")


def build(directory: Path) -> list[Doc]:
    """The objects `kustomize build directory` would print (in resource order)."""
    (kustomization,) = load_docs(directory / "kustomization.yaml")
    unknown = set(kustomization) - SUPPORTED_KEYS
    if unknown:
        raise ValueError(f"{directory}: unsupported kustomization keys {sorted(unknown)}")
    docs: list[Doc] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        docs += build(path) if path.is_dir() else load_docs(path)
    for generator in kustomization.get("configMapGenerator", []):
        docs.append(generate_configmap(directory, generator))
    if "namespace" in kustomization:
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = kustomization["namespace"]
    for patch_entry in kustomization.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise ValueError(f"{directory}: only `path` patches are supported: {patch_entry}")
        for patch in load_docs(directory / patch_entry["path"]):
            docs = apply_patch(docs, patch, directory / patch_entry["path"])
    for image in kustomization.get("images", []):
        for doc in docs:
            for container in pod_containers(doc):
                set_image(container, image)
    return docs


def generate_configmap(directory: Path, generator: Doc) -> Doc:
    """The ConfigMap of one `configMapGenerator` entry (file contents as `data`)."""
    options = generator.get("options", {})
    unknown = (set(generator) - GENERATOR_KEYS) | (set(options) - GENERATOR_OPTIONS)
    if unknown:
        raise ValueError(f"{directory}: unsupported configMapGenerator fields {sorted(unknown)}")
    if options.get("disableNameSuffixHash") is not True:
        raise ValueError(f"{directory}: set disableNameSuffixHash (no name hashes here)")
    data: dict[str, str] = {}
    for entry in generator["files"]:
        key, _, source = entry.rpartition("=")
        path = (directory / source).resolve()
        if not path.is_relative_to(directory.resolve()):
            raise ValueError(f"{directory}: {source} is outside the kustomization's directory")
        data[key or path.name] = path.read_text()
    metadata: Doc = {"name": generator["name"]}
    for field in ("labels", "annotations"):
        if field in options:
            metadata[field] = dict(options[field])
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def apply_patch(docs: list[Doc], patch: Doc, source: Path) -> list[Doc]:
    """Strategic-merge `patch` into the one object it names."""
    patch = copy.deepcopy(patch)
    delete = patch.pop("$patch", None) == "delete"
    targets = [
        d
        for d in docs
        if d["kind"] == patch["kind"] and d["metadata"]["name"] == patch["metadata"]["name"]
    ]
    if len(targets) != 1:
        raise ValueError(f"{source}: patch matches {len(targets)} objects")
    if delete:
        return [d for d in docs if d is not targets[0]]
    merge(targets[0], patch)
    return docs


def merge(base: Any, patch: Any, key: str = "") -> Any:
    """Strategic merge: maps recursively, lists with a merge key by that key, others replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        for k, v in patch.items():
            base[k] = merge(base[k], v, k) if k in base else v
        return base
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        merge_key = MERGE_KEYS[key]
        by_key = {item[merge_key]: item for item in base}
        for item in patch:
            if item[merge_key] in by_key:
                merge(by_key[item[merge_key]], item)
            else:
                base.append(item)
        return base
    return patch


def pod_spec(doc: Doc) -> Doc | None:
    """The pod template spec of a workload, else None."""
    if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return doc["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return None


def pod_containers(doc: Doc) -> list[Doc]:
    spec = pod_spec(doc)
    if spec is None:
        return []
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def set_image(container: Doc, image: Doc) -> None:
    name, tag = container["image"], ""
    if ":" in name.rsplit("/", 1)[-1]:
        name, tag = name.rsplit(":", 1)
    if name != image["name"]:
        return
    container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
