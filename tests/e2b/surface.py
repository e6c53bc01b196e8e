"""Every parameter of the e2b SDK's API client that Hearth's E2B door
serves, from the SDK's own generated models.

Walks the request models (`e2b.api.client.models`) of each served route
with a body, and the query parameters of each served list, and prints one
JSON object per line for each field, nested fields included: the
operation, the field's path (`network.egressProxy.tls`) and a body (or
query) holding just that field, with the required fields around it filled
in. `crates/hearth-control/tests/control/e2b_surface.rs` sends each one and
checks that Hearth acts on it or refuses it with a 400 naming it: never a
silent yes. Routes Hearth does not serve (volumes, template builds,
refreshes) answer 501 whatever their body, so they are not walked.
"""

import enum
import inspect
import json
import re
import types
import typing

import attrs

from e2b.api.client import models as M
from e2b.api.client import types as T
from e2b.api.client.api.sandboxes import (
    get_sandboxes,
    get_sandboxes_sandbox_id_logs,
    get_sandboxes_sandbox_id_metrics,
    get_v2_sandboxes,
    get_v_2_sandboxes_sandbox_id_logs,
)
from e2b.api.client.api.secrets import get_secrets
from e2b.api.client.api.snapshots import get_snapshots

BODIES = {
    "create": M.NewSandbox,
    "create_v2": M.NewSandboxV2,
    "timeout": M.SandboxTimeoutRequest,
    "pause": M.SandboxPauseRequest,
    "connect": M.ConnectSandbox,
    "connect_v2": M.ConnectSandboxV2,
    "resume": M.ResumedSandbox,
    "snapshot": M.SandboxSnapshotRequest,
    "fork": M.SandboxForkRequest,
    "network": M.SandboxNetworkUpdateConfig,
    "create_secret": M.NewSecret,
    "update_secret": M.SecretUpdate,
    "create_volume": M.NewVolume,
}

QUERIES = {
    "list": get_sandboxes,
    "list_v2": get_v2_sandboxes,
    "list_snapshots": get_snapshots,
    "metrics": get_sandboxes_sandbox_id_metrics,
    "logs": get_sandboxes_sandbox_id_logs,
    "logs_v2": get_v_2_sandboxes_sandbox_id_logs,
    "list_secrets": get_secrets,
}

# Samples well formed for what a field's name says it holds, so that a
# refusal is about the field, not about a malformed value.
NAMED = {
    "templateID": "base",
    "timeout": 60,
    "count": 1,
    "limit": 1,
    "name": "surface",
    "value": "s3cret",
    "allowOut": ["api.test"],
    "denyOut": ["10.0.0.0/8"],
    "dnsServers": ["8.8.8.8"],
    "httpsPorts": [8443],
    "maskRequestHost": "localhost:${PORT}",
    "address": "socks5.test:1080",
    "path": "/mnt/data",
    "state": "running",
    "metadata": {"team": "a"},
    "envVars": {"A": "1"},
    # Windows that miss now: answered without asking the guest.
    "start": 4102444800,
    "end": 1,
    "startedAfter": "2026-01-01T00:00:00Z",
    "nextToken": "$NEXT",
    "sandboxID": "$SANDBOX",
    "template": "base",
    "order": "asc",
    "cursor": 0,
    "direction": "backward",
    "level": "warn",
    "search": "process",
}

# The key a map's sample uses: the exercises use the same.
MAP_KEY = {
    "SandboxNetworkConfigRules": "api.test",
    "SandboxNetworkUpdateConfigRules": "api.test",
    "SandboxNetworkTransformHeaders": "X-Surface",
    "SecretMetadata": "team",
}


def json_keys(cls):
    """Attribute name -> JSON key, read from the model's `to_dict`."""
    src = inspect.getsource(cls.to_dict)
    keys = {}
    for key, var in re.findall(r'field_dict\["([^"]+)"\]\s*=\s*(\w+)', src):
        keys.setdefault(var, key)
    for key, var in re.findall(r'"([^"]+)":\s*(\w+),', src):
        keys.setdefault(var, key)
    return keys


def hints(cls):
    ns = dict(vars(M))
    ns.update(vars(T))
    ns.update({"Any": typing.Any, "Union": typing.Union})
    return typing.get_type_hints(cls, globalns=ns)


def strip(tp):
    """The one type of `Union[Unset, X]` / `Union[X, None, Unset]`."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a not in (T.Unset, type(None))]
        if len(args) == 1:
            return strip(args[0])
        return args[0]
    return tp


def fields(cls):
    """(attribute, JSON key, type, required) of a model, but its map."""
    keys = json_keys(cls)
    h = hints(cls)
    out = []
    for f in attrs.fields(cls):
        if f.name == "additional_properties":
            continue
        out.append((f.name, keys.get(f.name, f.name), strip(h[f.name]), f.default is attrs.NOTHING))
    return out


def map_value(cls):
    """A model that is only a map: the type of its values, else None."""
    if fields(cls):
        return None
    tp = hints(cls).get("additional_properties")
    args = typing.get_args(tp)
    return strip(args[1]) if len(args) == 2 else None


def sample(tp, key):
    if key in NAMED:
        return NAMED[key]
    origin = typing.get_origin(tp)
    if tp is bool:
        return True
    if tp is int:
        return 1
    if tp is str:
        return "surface"
    if tp is typing.Any:
        return {"k": "v"}
    if origin is list:
        return [sample(typing.get_args(tp)[0], key)]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return list(tp)[0].value
    if attrs.has(tp):
        inner = map_value(tp)
        if inner is not None:
            return {MAP_KEY.get(tp.__name__, "k"): sample(inner, "")}
        return {k: sample(t, k) for (_, k, t, req) in fields(tp) if req}
    return "surface"


def walk(op, cls, prefix, wrap, out):
    """One line per field of `cls`, its body made by `wrap` from the
    field's own object (the required fields around it filled)."""
    inner = map_value(cls)
    if inner is not None:
        key = MAP_KEY.get(cls.__name__, "k")
        path = f"{prefix}.{key}" if prefix else key
        if typing.get_origin(inner) is list:
            elem = typing.get_args(inner)[0]
            if attrs.has(elem):
                walk(op, elem, path + "[]", lambda v: wrap({key: [v]}), out)
        elif attrs.has(inner):
            walk(op, inner, path, lambda v: wrap({key: v}), out)
        return
    required = {k: sample(t, k) for (_, k, t, req) in fields(cls) if req}
    for _, key, tp, _ in fields(cls):
        path = f"{prefix}.{key}" if prefix else key
        value = dict(required)
        value[key] = sample(tp, key)
        out.append({"op": op, "path": path, "body": wrap(value)})
        elem = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        if attrs.has(tp):
            walk(
                op,
                tp,
                path,
                lambda v, key=key, required=required: wrap({**required, key: v}),
                out,
            )
        elif elem is not None and attrs.has(elem):
            walk(
                op,
                elem,
                path + "[]",
                lambda v, key=key, required=required: wrap({**required, key: [v]}),
                out,
            )


def query_params(fn):
    src = inspect.getsource(fn._get_kwargs)
    return sorted(set(re.findall(r'params\["([^"]+)"\]', src)))


def main():
    out = []
    for op, cls in BODIES.items():
        walk(op, cls, "", lambda v: v, out)
    for op, fn in QUERIES.items():
        for p in query_params(fn):
            out.append({"op": op, "path": p, "body": {p: NAMED.get(p, "surface")}})
    for line in out:
        print(json.dumps(line))


if __name__ == "__main__":
    main()
