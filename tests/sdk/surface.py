"""Every parameter of the langsmith SDK's sandbox API, from its own types.

Walks the request TypedDicts the SDK is generated from (`langsmith.types`)
and prints one JSON object per line for each field, nested fields
included: the operation, the field's path (`proxy_config.rules[].aws`) and
a body (or query) holding just that field, with the required fields
around it filled in. `crates/hearth-control/tests/control/sdk_surface.rs` sends
each one and checks that Hearth acts on it or refuses it with a 422 naming
it: never a silent yes.
"""

import json
import sys
import typing

from typing_extensions import get_args, get_origin, is_typeddict

from langsmith.types.sandboxes import (
    box_batch_delete_params,
    box_create_params,
    box_create_snapshot_params,
    box_generate_download_url_params,
    box_generate_service_url_params,
    box_list_params,
    box_update_params,
    registry_create_params,
    registry_list_params,
    registry_update_params,
    snapshot_create_params,
    snapshot_list_params,
    volume_clone_params,
    volume_create_params,
    volume_list_params,
    volume_update_params,
)

OPERATIONS = {
    "create": box_create_params.BoxCreateParams,
    "update": box_update_params.BoxUpdateParams,
    "capture": box_create_snapshot_params.BoxCreateSnapshotParams,
    "create_snapshot": snapshot_create_params.SnapshotCreateParams,
    "service_url": box_generate_service_url_params.BoxGenerateServiceURLParams,
    "download_url": box_generate_download_url_params.BoxGenerateDownloadURLParams,
    "list_sandboxes": box_list_params.BoxListParams,
    "list_snapshots": snapshot_list_params.SnapshotListParams,
    "create_registry": registry_create_params.RegistryCreateParams,
    "update_registry": registry_update_params.RegistryUpdateParams,
    "list_registries": registry_list_params.RegistryListParams,
    "create_volume": volume_create_params.VolumeCreateParams,
    "batch_delete": box_batch_delete_params.BoxBatchDeleteParams,
    "update_volume": volume_update_params.VolumeUpdateParams,
    "clone_volume": volume_clone_params.VolumeCloneParams,
    "list_volumes": volume_list_params.VolumeListParams,
}

# Samples that are well formed where a field's name says what it holds, so
# that a refusal is about the field, not about a malformed neighbour.
NAMED = {
    "url": "https://callback.test/hook",
    "match_hosts": ["api.test"],
    "mount_path": "/mnt/data",
    "endpoint_url": "https://s3.test",
    "remote_url": "https://git.test/repo.git",
    "docker_image": "docker.io/library/busybox:latest",
    "ttl_seconds": 60,
    "fs_capacity_bytes": 1 << 30,
    "name": "surface",
    "body_name": "surface",
    "id": "m1",
    "path": "/etc/hostname",
    "port": 8080,
    "size_bytes": 1 << 30,
}


def unwrap(tp):
    """The type inside Required/NotRequired/Annotated/Optional."""
    while True:
        origin = get_origin(tp)
        if origin in (typing_extensions_required(), typing_extensions_not_required()):
            tp = get_args(tp)[0]
        elif origin is typing.Annotated:
            tp = get_args(tp)[0]
        else:
            return tp


def typing_extensions_required():
    import typing_extensions

    return typing_extensions.Required


def typing_extensions_not_required():
    import typing_extensions

    return typing_extensions.NotRequired


def wire_name(td, key):
    """A field's name on the wire (`body_name` is sent as `name`)."""
    hints = typing.get_type_hints(td, include_extras=True)
    tp = hints[key]
    while True:
        origin = get_origin(tp)
        if origin is typing.Annotated:
            for meta in get_args(tp)[1:]:
                alias = getattr(meta, "alias", None)
                if alias:
                    return alias
            tp = get_args(tp)[0]
        elif origin in (typing_extensions_required(), typing_extensions_not_required()):
            tp = get_args(tp)[0]
        else:
            return key


def alternatives(tp):
    tp = unwrap(tp)
    if get_origin(tp) is typing.Union:
        return [a for a in get_args(tp) if a is not type(None)]
    return [tp]


def sample(tp, name):
    if name in NAMED:
        return NAMED[name]
    tp = alternatives(tp)[0]
    origin = get_origin(tp)
    if is_typeddict(tp):
        return required_fields(tp)
    if origin is typing.Literal:
        return get_args(tp)[0]
    if origin in (list, typing.List, typing.Sequence) or str(origin) in (
        "<class 'collections.abc.Iterable'>",
        "<class 'collections.abc.Sequence'>",
    ):
        return [sample(get_args(tp)[0], name)]
    if origin in (dict, typing.Dict):
        return {"SURFACE_KEY": "v"}
    if tp is bool:
        return True
    if tp is int:
        return 60
    if tp is float:
        return 1.5
    if tp is str:
        return "x"
    name = getattr(tp, "__name__", str(tp))
    if name == "SequenceNotStr":
        return [sample(get_args(tp)[0], name)]
    raise SystemExit(f"no sample for {tp!r} ({name})")


def required_keys(td):
    """The keys of `td` a body must carry. (The SDK's modules use postponed
    annotations, so `__required_keys__` cannot see `Required[...]`.)"""
    hints = typing.get_type_hints(td, include_extras=True)
    keys = []
    for k, tp in hints.items():
        origin = get_origin(tp)
        if origin is typing.Annotated:
            origin = get_origin(get_args(tp)[0])
        if origin is typing_extensions_required():
            keys.append(k)
        elif getattr(td, "__total__", True) and origin is not typing_extensions_not_required():
            keys.append(k)
    return keys


# Filled in whenever an object has them, though the SDK does not require
# them: Hearth does (a rule or callback without hosts would match nothing,
# a service URL needs its port).
ALWAYS = ("match_hosts", "port")


def required_fields(td):
    hints = typing.get_type_hints(td, include_extras=True)
    keys = required_keys(td) + [k for k in ALWAYS if k in hints]
    return {wire_name(td, k): sample(hints[k], wire_name(td, k)) for k in keys}


def is_list(tp):
    tp = unwrap(tp)
    origin = get_origin(tp)
    name = getattr(tp, "__name__", "") or getattr(origin, "__name__", "")
    return origin in (list,) or name in ("Iterable", "Sequence", "SequenceNotStr", "List")


def walk(td, prefix, build, out, depth=0):
    """Each field of `td` (and of the TypedDicts inside it): its path and a
    whole body, made by `build` from the object holding it."""
    if depth > 6:
        return
    hints = typing.get_type_hints(td, include_extras=True)
    for key, tp in hints.items():
        name = wire_name(td, key)
        path = f"{prefix}{name}"
        obj = required_fields(td)
        obj[name] = sample(tp, name)
        out.append((path, build(obj)))
        for alt in alternatives(tp):
            inner = alt
            listed = False
            if is_list(alt) and get_args(unwrap(alt)):
                inner = alternatives(get_args(unwrap(alt))[0])[0]
                listed = True
            if is_typeddict(inner):
                def nested(child, name=name, listed=listed, td=td):
                    parent = required_fields(td)
                    parent[name] = [child] if listed else child
                    return build(parent)

                walk(inner, f"{path}[]." if listed else f"{path}.", nested, out, depth + 1)


def main():
    seen = set()
    for op, td in OPERATIONS.items():
        found = []
        walk(td, "", lambda obj: obj, found)
        for path, body in found:
            if (op, path) in seen:
                continue
            seen.add((op, path))
            print(json.dumps({"op": op, "path": path, "body": body}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
