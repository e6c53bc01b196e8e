#!/usr/bin/env python3
"""Static consistency test of the Hearth Helm chart (deploy/helm/hearth).

Needs Python 3 and PyYAML (Debian: python3-yaml); no helm, no cluster.

1. values: every `.Values.a.b` a template reads exists in values.yaml, every
   leaf of values.yaml is read by some template (unless ALLOWED_UNUSED says
   why not), and every key of values.yaml has a comment.
2. rendering: a small renderer for the subset of Go templates the chart
   keeps to (see templates/_helpers.tpl) renders every template for several
   sets of values (numbers as Helm holds them: float64); each must give
   valid YAML, and the objects are checked against the fleet as built: the
   exact environment of each component (the host autoscaler, lease TTL and
   failover grace on the control plane; store and capacity on the hosts;
   no database URL on hosts), the control plane's RBAC (scale of the host
   Deployment, only with autoscaling) and none for hosts, the enrollment
   token and master key Secrets feeding both, `--control` of `host serve`
   and of the preStop drain naming the control Service and port, writable
   data dirs, the host pool's scheduling and rollout, the control plane's
   replicas (3 by default), their PodDisruptionBudget, anti-affinity and
   rollout. `required` values must fail the render when unset, and more
   than one control replica without an external PostgreSQL must `fail` it.
3. code: with the repository's crates next to this script, the names the
   chart relies on (environment variables, flags, the autoscaler's lists,
   the Kubernetes backend's calls) are checked against the sources.
4. helm: when a `helm` binary is on PATH, `helm lint` and `helm template`
   run too and must produce the same objects (kinds and names).

Exit status 0 when everything holds; a summary is printed either way.

    python3 deploy/helm/test_chart.py [CHART_DIR] [--dump=SCENARIO]

--dump prints what the tiny renderer makes of the chart for one scenario
(defaults, autoscaling, pdb, other-branches) and exits.
"""

import base64
import copy
import decimal
import json
import re
import secrets
import shutil
import string
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import yaml
except ImportError:  # the Rust wrapper checks this first; be explicit anyway
    print("test_chart.py needs PyYAML (apt-get install python3-yaml)", file=sys.stderr)
    sys.exit(2)

# The chart checked: deploy/helm/hearth, or the directory given as argument.
_ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
CHART = Path(_ARGS[0]).resolve() if _ARGS else Path(__file__).resolve().parent / "hearth"
RELEASE = "demo"
NAMESPACE = "sandboxes"

# Leaves of values.yaml no template reads, each with the reason. Empty: every
# value is used.
ALLOWED_UNUSED = {
    # "path.to.leaf": "why it is kept",
}

# The values every render needs (the chart has no default for them).
REQUIRED_VALUES = {
    "images": {"hearth": {"tag": "0.1.0-test"}},
    "store": {"url": "s3://hearth-test/store?region=us-east-1"},
}

# The contract of the fleet as the code has it (crates/hearth-cli/src/
# {main,up,fleet}.rs, crates/hearth-fleet/src/autoscale.rs); when the sources
# are next to this script, check_sources() holds these names to them.
REPO = Path(__file__).resolve().parent.parent.parent
# `hearth --data-dir`'s default (main.rs).
DEFAULT_DATA_DIR = "/var/lib/hearth"

# The host autoscaler's environment: it runs in the control plane (the
# replica holding the `autoscaler` lease), never in the hosts. A key of
# sandboxHost.autoscaling, or None when the chart derives the value.
AUTOSCALE_ENV = {
    "HEARTH_AUTOSCALE_ENABLED": "enabled",
    "HEARTH_AUTOSCALE_MIN_REPLICAS": "minReplicas",
    "HEARTH_AUTOSCALE_MAX_REPLICAS": "maxReplicas",
    "HEARTH_AUTOSCALE_TARGET_UTILIZATION_PERCENT": "targetUtilizationPercent",
    "HEARTH_AUTOSCALE_HEADROOM_HOSTS": "headroomHosts",
    "HEARTH_AUTOSCALE_SCALE_DOWN_STABILIZATION_SECONDS": "scaleDownStabilizationSeconds",
    "HEARTH_AUTOSCALE_HOST_CPU_MILLICORES": None,  # sandboxHost.capacity.vcpus × 1000
    "HEARTH_AUTOSCALE_BACKEND": None,  # kubernetes
    "HEARTH_AUTOSCALE_DEPLOYMENT": None,  # the host Deployment
    "HEARTH_AUTOSCALE_NAMESPACE": None,  # the downward API's metadata.namespace
}

# Exactly the environment of each component (AWS_* only with
# store.existingSecret). The control plane, run with --no-local-host, never
# opens the store; hosts never open the database and never run the
# autoscaler; the lease TTL and failover grace are the control plane's.
CONTROL_ENV = {
    "HEARTH_DATABASE_URL",
    "HEARTH_PUBLIC_URL",
    "HEARTH_DATA_DIR",
    "HEARTH_MASTER_KEY_FILE",
    "HEARTH_HOST_TOKEN",
    "HEARTH_LOG",
    "HEARTH_HOST_LEASE_TTL_SECONDS",
    "HEARTH_FAILOVER_GRACE_SECONDS",
} | set(AUTOSCALE_ENV)
HOST_ENV = {
    "POD_IP",  # --advertise $(POD_IP):port
    "HEARTH_DATA_DIR",
    "HEARTH_HOST_TOKEN",
    "HEARTH_STORE_URL",
    "HEARTH_MASTER_KEY_FILE",
    "HEARTH_HOST_CPU_MILLICORES",
    "HEARTH_HOST_MEMORY",
    "HEARTH_COMMIT_INTERVAL_SECS",
    "HEARTH_LOG",
}
STORE_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")

# What the control plane's ServiceAccount may do when the autoscaler is on:
# hearth_fleet::KubeDeployment reads and merge-patches the host
# Deployment's scale subresource, and touches nothing else.
CONTROL_RBAC = {("apps", "deployments/scale", verb) for verb in ("get", "patch")}

# hearth_types::ByteSize (HEARTH_HOST_MEMORY): digits and one of these
# units, case-insensitive; Kubernetes' Gi/Mi are not among them.
BYTE_SIZE = re.compile(r"^\s*\d+\s*(|b|k|kb|kib|m|mb|mib|g|gb|gib|t|tb|tib)\s*$", re.I)
U32 = 2**32 - 1

HOST_LABEL = "hearth.dev/host"


# --------------------------------------------------------------------------
# A renderer for the chart's subset of Go templates (text/template + the few
# Sprig/Helm functions listed in _helpers.tpl).
# --------------------------------------------------------------------------


class TemplateError(Exception):
    pass


class RequiredError(TemplateError):
    pass


class FailError(TemplateError):
    """A template's `fail`: the render is refused with this message."""


WS = " \t\r\n"


class Text:
    def __init__(self, s):
        self.s = s


class Action:
    def __init__(self, src, where):
        self.src = src
        self.where = where


def lex(src, fname):
    """Splits a template into Text and Action items, applying the trim
    markers `{{- ` and ` -}}`; comments are dropped."""
    items = []
    i = 0
    trim_next = False
    while True:
        j = src.find("{{", i)
        text = src[i:] if j < 0 else src[i:j]
        if trim_next:
            text = text.lstrip(WS)
        if j < 0:
            items.append(Text(text))
            return items
        k = j + 2
        if src[k : k + 1] == "-" and src[k + 1 : k + 2] in tuple(WS):
            text = text.rstrip(WS)
            k += 2
        items.append(Text(text))
        where = f"{fname}:{src.count(chr(10), 0, j) + 1}"
        body_start = k
        if src.startswith("/*", k):
            end = src.find("*/", k)
            if end < 0:
                raise TemplateError(f"{where}: unclosed comment")
            rest = end + 2
            if src.startswith(" -}}", rest):
                trim_next, i = True, rest + 4
            elif src.startswith("}}", rest):
                trim_next, i = False, rest + 2
            else:
                raise TemplateError(f"{where}: comment must end the action")
            continue
        p = body_start
        while p < len(src):
            c = src[p]
            if c == '"':
                p += 1
                while p < len(src) and src[p] != '"':
                    p += 2 if src[p] == "\\" else 1
            elif c == "`":
                p = src.index("`", p + 1)
            elif src.startswith("}}", p):
                break
            p += 1
        else:
            raise TemplateError(f"{where}: unclosed action")
        body = src[body_start:p]
        trim_next = len(body) >= 2 and body[-1] == "-" and body[-2] in WS
        if trim_next:
            body = body[:-1]
        items.append(Action(body.strip(), where))
        i = p + 2


TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<decl>:=)
  | (?P<assign>=)
  | (?P<pipe>\|)
  | (?P<lp>\()
  | (?P<rp>\))
  | (?P<num>-?\d+(?:\.\d+)?)
  | (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
  | (?P<field>(?:\.[A-Za-z0-9_]+)+|\.)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    """,
    re.X,
)

KEYWORDS_OUTSIDE_SUBSET = {"with", "range", "template", "block", "break", "continue"}


def tokenize(src, where):
    toks, pos = [], 0
    while pos < len(src):
        m = TOKEN_RE.match(src, pos)
        if not m:
            raise TemplateError(f"{where}: cannot read {src[pos:]!r}")
        pos = m.end()
        kind = m.lastgroup
        if kind == "ws":
            continue
        toks.append((kind, m.group()))
    return toks


def parse_pipeline(toks, pos, where):
    """[ $v := ] cmd { | cmd }; a cmd is operands; a '(' opens a sub-pipeline."""
    decl = None
    if (
        pos + 1 < len(toks)
        and toks[pos][0] == "var"
        and toks[pos + 1][0] in ("decl", "assign")
    ):
        decl = toks[pos][1]
        pos += 2
    cmds, cmd = [], []
    while pos < len(toks):
        kind, val = toks[pos]
        if kind == "rp":
            break
        if kind == "pipe":
            if not cmd:
                raise TemplateError(f"{where}: empty command in pipeline")
            cmds.append(cmd)
            cmd = []
            pos += 1
            continue
        if kind == "lp":
            sub, pos = parse_pipeline(toks, pos + 1, where)
            if pos >= len(toks) or toks[pos][0] != "rp":
                raise TemplateError(f"{where}: unclosed '('")
            cmd.append(("sub", sub))
            pos += 1
            continue
        if kind in ("decl", "assign"):
            raise TemplateError(f"{where}: unexpected {val}")
        if kind == "str":
            cmd.append(("lit", json.loads(val)))
        elif kind == "raw":
            cmd.append(("lit", val[1:-1]))
        elif kind == "num":
            cmd.append(("lit", float(val) if "." in val else int(val)))
        elif kind == "ident" and val in ("true", "false"):
            cmd.append(("lit", val == "true"))
        elif kind == "ident" and val == "nil":
            cmd.append(("lit", None))
        else:
            cmd.append((kind, val))
        pos += 1
    if not cmd:
        raise TemplateError(f"{where}: empty pipeline")
    cmds.append(cmd)
    return (decl, cmds), pos


class If:
    def __init__(self, branches, otherwise, where):
        self.branches = branches  # [(pipeline, nodes)]
        self.otherwise = otherwise
        self.where = where


class Out:
    def __init__(self, pipeline, where):
        self.pipeline = pipeline
        self.where = where


def parse_items(items, defines, fname):
    """Builds the node tree; `define` blocks go to `defines`."""
    pos = 0

    def control(item):
        toks = tokenize(item.src, item.where)
        if toks and toks[0][0] == "ident":
            return toks[0][1], toks
        return None, toks

    def parse_list(stop):
        nonlocal pos
        nodes = []
        while pos < len(items):
            item = items[pos]
            pos += 1
            if isinstance(item, Text):
                if item.s:
                    nodes.append(item)
                continue
            word, toks = control(item)
            if word in KEYWORDS_OUTSIDE_SUBSET:
                raise TemplateError(
                    f"{item.where}: `{word}` is outside the chart's template subset"
                )
            if word in ("end", "else"):
                if word not in stop:
                    raise TemplateError(f"{item.where}: unexpected {word}")
                return nodes, (word, toks, item.where)
            if word == "define":
                if len(toks) != 2 or toks[1][0] != "str":
                    raise TemplateError(f"{item.where}: define needs a name")
                name = json.loads(toks[1][1])
                body, _ = parse_list({"end"})
                defines[name] = body
                continue
            if word == "if":
                branches, otherwise = [], []
                cond, p = parse_pipeline(toks, 1, item.where)
                while True:
                    body, (term, ttoks, twhere) = parse_list({"end", "else"})
                    branches.append((cond, body))
                    if term == "end":
                        break
                    if len(ttoks) > 1 and ttoks[1] == ("ident", "if"):
                        cond, _ = parse_pipeline(ttoks, 2, twhere)
                        continue
                    otherwise, _ = parse_list({"end"})
                    break
                nodes.append(If(branches, otherwise, item.where))
                continue
            pipeline, p = parse_pipeline(toks, 0, item.where)
            if p != len(toks):
                raise TemplateError(f"{item.where}: unexpected ')'")
            nodes.append(Out(pipeline, item.where))
        if stop:
            raise TemplateError(f"{fname}: missing {{{{ end }}}}")
        return nodes, None

    nodes, _ = parse_list(set())
    return nodes


def truth(v):
    if v is None or v is False:
        return False
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v != 0
    if isinstance(v, (str, list, dict, tuple)):
        return len(v) > 0
    return True


def go_str(v, where="?"):
    """What `{{ v }}` prints (Helm prints a missing value as nothing)."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return go_float(v)
    if isinstance(v, str):
        return v
    raise TemplateError(f"{where}: printing a {type(v).__name__} ({v!r}); use toYaml")


def go_float(v):
    """Go's %v of a float64 (strconv 'g', shortest): exponent form from
    1e+06 up and below 1e-04, as Helm prints a number read from values."""
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "0"
    d = decimal.Decimal(repr(v)).normalize()
    sign, digits, exponent = d.as_tuple()
    exp = len(digits) + exponent - 1
    neg = "-" if sign else ""
    if exp < -4 or exp >= 6:
        mant = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
        return f"{neg}{mant}e{'+' if exp >= 0 else '-'}{abs(exp):02d}"
    return neg + format(abs(d), "f")


def helm_numbers(v):
    """Values as Helm holds them: every number of a values file is a float64."""
    if isinstance(v, dict):
        return {k: helm_numbers(x) for k, x in v.items()}
    if isinstance(v, list):
        return [helm_numbers(x) for x in v]
    if isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v


def json_numbers(v):
    """What toYaml prints of a float64 that is a whole number (sigs.k8s.io/yaml
    goes through JSON: 8080, not 8080.0)."""
    if isinstance(v, dict):
        return {k: json_numbers(x) for k, x in v.items()}
    if isinstance(v, list):
        return [json_numbers(x) for x in v]
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e21:
        return int(v)
    return v


def go_int(v, where):
    """Sprig's toInt64 of what a template passes to `int` or `mul`."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return int(v)
    if isinstance(v, str):
        try:
            return int(float(v)) if v.strip() else 0
        except ValueError:
            return 0
    if v is None:
        return 0
    raise TemplateError(f"{where}: cannot make an integer of {v!r}")


def go_quote(s):
    return json.dumps(s, ensure_ascii=False)


def go_printf(fmt, *args, where="?"):
    out, ai = [], 0

    def arg():
        nonlocal ai
        if ai >= len(args):
            raise TemplateError(f"{where}: printf: missing argument for {fmt!r}")
        ai += 1
        return args[ai - 1]

    for piece in re.split(r"(%[%sdvq])", fmt):
        if piece == "%%":
            out.append("%")
        elif piece == "%s":
            a = arg()
            if not isinstance(a, str):
                raise TemplateError(f"{where}: printf %s of a non-string {a!r} (use %v)")
            out.append(a)
        elif piece == "%d":
            a = arg()
            if not isinstance(a, int) or isinstance(a, bool):
                raise TemplateError(f"{where}: printf %d of {a!r}")
            out.append(str(a))
        elif piece == "%v":
            out.append(go_str(arg(), where))
        elif piece == "%q":
            out.append(go_quote(go_str(arg(), where)))
        else:
            out.append(piece)
    if ai != len(args):
        raise TemplateError(f"{where}: printf: extra arguments for {fmt!r}")
    return "".join(out)


def to_yaml(v):
    if v is None:
        return "null"
    return yaml.safe_dump(json_numbers(v), default_flow_style=False, sort_keys=True, allow_unicode=True).rstrip("\n")


def indent(n, s):
    pad = " " * n
    return pad + s.replace("\n", "\n" + pad)


def helm_trunc(n, s):
    if n < 0 and len(s) + n > 0:
        return s[len(s) + n :]
    if n >= 0 and len(s) > n:
        return s[:n]
    return s


def go_gt(where, a, b):
    """text/template's `gt`: numbers of one kind, or strings; an int
    against a float (as values are) is an error, as in Go."""
    kinds = {type(a), type(b)}
    if bool in kinds or not (kinds <= {int} or kinds <= {float} or kinds <= {str}):
        raise TemplateError(f"{where}: gt: incompatible types {a!r} and {b!r} (use int)")
    return a > b


def go_has_prefix(where, prefix, s):
    if not isinstance(prefix, str) or not isinstance(s, str):
        raise TemplateError(f"{where}: hasPrefix of a non-string")
    return s.startswith(prefix)


def go_fail(where, msg):
    raise FailError(msg)


def index_fn(m, *keys):
    for k in keys:
        if m is None:
            raise TemplateError("index of nil")
        if isinstance(m, dict):
            m = m.get(k)
        elif isinstance(m, list):
            m = m[k]
        else:
            raise TemplateError(f"cannot index {type(m).__name__}")
    return m


class Renderer:
    def __init__(self, defines, lookups=None):
        self.defines = defines
        self.lookups = lookups or {}
        self.values_read = set()
        self.funcs = {
            "toYaml": lambda w, v: to_yaml(v),
            "nindent": lambda w, n, s: "\n" + indent(n, s),
            "indent": lambda w, n, s: indent(n, s),
            "quote": lambda w, *a: " ".join(go_quote(go_str(x, w)) for x in a if x is not None),
            "default": lambda w, d, *g: d if not g or not truth(g[0]) else g[0],
            "required": self.required,
            "fail": go_fail,
            "gt": go_gt,
            "hasPrefix": go_has_prefix,
            "printf": lambda w, f, *a: go_printf(f, *a, where=w),
            "trunc": lambda w, n, s: helm_trunc(n, s),
            "trimSuffix": lambda w, suf, s: s[: -len(suf)] if suf and s.endswith(suf) else s,
            "replace": lambda w, old, new, s: s.replace(old, new),
            "not": lambda w, v: not truth(v),
            "empty": lambda w, v: not truth(v),
            "eq": lambda w, a, *b: any(a == x for x in b),
            "ne": lambda w, a, b: a != b,
            "index": lambda w, m, *k: index_fn(m, *k),
            "lookup": lambda w, av, kind, ns, name: copy.deepcopy(
                self.lookups.get((av, kind, ns, name), {})
            ),
            "randAlphaNum": lambda w, n: "".join(
                secrets.choice(string.ascii_letters + string.digits) for _ in range(n)
            ),
            "b64enc": lambda w, s: base64.b64encode(s.encode()).decode(),
            "int": lambda w, v: go_int(v, w),
            "mul": lambda w, a, *b: self.mul(w, a, *b),
        }

    @staticmethod
    def mul(where, a, *b):
        out = go_int(a, where)
        for x in b:
            out *= go_int(x, where)
        return out

    @staticmethod
    def required(where, msg, v):
        if v is None or (isinstance(v, str) and v == ""):
            raise RequiredError(msg)
        return v

    def render(self, nodes, dot, scope):
        out = []
        for n in nodes:
            if isinstance(n, Text):
                out.append(n.s)
            elif isinstance(n, If):
                for cond, body in n.branches:
                    if truth(self.pipeline(cond, dot, scope, n.where)):
                        out.append(self.render(body, dot, scope))
                        break
                else:
                    out.append(self.render(n.otherwise, dot, scope))
            else:
                v = self.pipeline(n.pipeline, dot, scope, n.where)
                if n.pipeline[0] is None:  # a declaration prints nothing
                    out.append(go_str(v, n.where))
        return "".join(out)

    def pipeline(self, p, dot, scope, where):
        decl, cmds = p
        v = _NOTHING
        for cmd in cmds:
            v = self.command(cmd, dot, scope, where, v)
        if decl is not None:
            scope[decl] = v
        return v

    def command(self, cmd, dot, scope, where, piped):
        head = cmd[0]
        if head[0] == "ident":
            name = head[1]
            args = [self.operand(o, dot, scope, where) for o in cmd[1:]]
            if piped is not _NOTHING:
                args.append(piped)
            if name == "include":
                if len(args) != 2:
                    raise TemplateError(f"{where}: include takes a name and a context")
                return self.include(args[0], args[1], where)
            if name == "and":
                return next((a for a in args if not truth(a)), args[-1])
            if name == "or":
                return next((a for a in args if truth(a)), args[-1])
            fn = self.funcs.get(name)
            if fn is None:
                raise TemplateError(f"{where}: function {name!r} is outside the chart's subset")
            try:
                return fn(where, *args)
            except TypeError as e:
                raise TemplateError(f"{where}: {name}: {e}") from e
        if len(cmd) != 1 or piped is not _NOTHING:
            raise TemplateError(f"{where}: {head[1]!r} is not a function")
        return self.operand(head, dot, scope, where)

    def operand(self, op, dot, scope, where):
        kind, val = op
        if kind == "lit":
            return val
        if kind == "sub":
            return self.pipeline(val, dot, scope, where)
        if kind == "field":
            return self.walk(dot, [f for f in val.split(".") if f], where, val)
        if kind == "var":
            name, *fields = val.split(".")
            if name not in scope:
                raise TemplateError(f"{where}: undefined variable {name}")
            return self.walk(scope[name], fields, where, val)
        raise TemplateError(f"{where}: unexpected {val!r}")

    def walk(self, v, fields, where, shown):
        if fields[:1] == ["Values"]:
            self.values_read.add(tuple(fields[1:]))
        for i, f in enumerate(fields):
            if v is None:
                raise TemplateError(f"{where}: nil pointer evaluating {shown} at .{f}")
            if not isinstance(v, dict):
                raise TemplateError(f"{where}: {shown}: .{f} of a {type(v).__name__}")
            v = v.get(f)
        return v

    def include(self, name, dot, where):
        body = self.defines.get(name)
        if body is None:
            raise TemplateError(f"{where}: no template {name!r}")
        return self.render(body, dot, {"$": dot})


_NOTHING = object()


# --------------------------------------------------------------------------
# The chart
# --------------------------------------------------------------------------


def deep_merge(base, over):
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


class Chart:
    def __init__(self, root):
        self.root = root
        self.meta = yaml.safe_load((root / "Chart.yaml").read_text())
        self.values_text = (root / "values.yaml").read_text()
        self.values = yaml.safe_load(self.values_text)
        self.defines = {}
        self.files = {}  # name -> nodes (rendered files only)
        self.actions = []  # (where, src) of every action, for the static scan
        for path in sorted((root / "templates").iterdir()):
            src = path.read_text()
            items = lex(src, path.name)
            self.actions += [(a.where, a.src) for a in items if isinstance(a, Action)]
            nodes = parse_items(items, self.defines, path.name)
            if not path.name.startswith("_"):
                self.files[path.name] = nodes

    def context(self, values):
        chart = {k[:1].upper() + k[1:]: v for k, v in self.meta.items()}
        return {
            "Values": values,
            "Release": {
                "Name": RELEASE,
                "Namespace": NAMESPACE,
                "Service": "Helm",
                "IsInstall": True,
                "IsUpgrade": False,
                "Revision": 1,
            },
            "Chart": chart,
            "Capabilities": {},
            "Template": {},
        }

    def render(self, overrides, lookups=None):
        """Renders every template; returns ({file: text}, Renderer, values).
        The templates see numbers as Helm does (float64); the values
        returned keep YAML's integers, for the checks."""
        values = deep_merge(self.values, overrides)
        r = Renderer(self.defines, lookups)
        dot = self.context(helm_numbers(values))
        out = {}
        for name, nodes in self.files.items():
            out[name] = r.render(nodes, dot, {"$": dot})
        return out, r, values


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------


class Checks:
    def __init__(self):
        self.count = 0
        self.failures = []
        self.sections = []

    def ok(self, cond, msg):
        self.count += 1
        if not cond:
            self.failures.append(msg)
        return cond

    def section(self, title):
        self.sections.append(title)


def leaves(v, path=()):
    if isinstance(v, dict) and v:
        for k, sub in v.items():
            yield from leaves(sub, path + (str(k),))
    else:
        yield path


def has_path(values, path):
    v = values
    for i, f in enumerate(path):
        if not isinstance(v, dict) or f not in v:
            return False
        v = v[f]
    return True


VALUES_REF = re.compile(r"\.Values((?:\.[A-Za-z0-9_]+)*)")


def check_values(chart, c):
    c.section("values.yaml <-> templates (static)")
    refs = set()
    for where, src in chart.actions:
        for m in VALUES_REF.finditer(src):
            path = tuple(f for f in m.group(1).split(".") if f)
            c.ok(path, f"{where}: bare .Values (read a path so it can be checked)")
            refs.add(path)
            c.ok(has_path(chart.values, path), f"{where}: .Values.{'.'.join(path)} is not in values.yaml")
        c.ok(
            not re.search(r"\bindex\s+\$?\.Values\b", src),
            f"{where}: `index .Values …` hides the path from this check",
        )
        c.ok(
            not re.search(r"\$\w*\s*:?=\s*\(?\s*\$?\.Values\b", src),
            f"{where}: a variable holding .Values hides the paths read through it",
        )
    for leaf in leaves(chart.values):
        name = ".".join(leaf)
        used = any(leaf[: len(r)] == r for r in refs)
        if name in ALLOWED_UNUSED:
            c.ok(not used, f"values.yaml: {name} is in ALLOWED_UNUSED but is used")
        else:
            c.ok(used, f"values.yaml: {name} is read by no template (dead value)")
    for name in ALLOWED_UNUSED:
        c.ok(has_path(chart.values, tuple(name.split("."))), f"ALLOWED_UNUSED names {name}, not in values.yaml")

    # Every key of values.yaml has a comment (on the line above or inline).
    stack = []  # (indent, key)
    prev = ""
    for lineno, line in enumerate(chart.values_text.splitlines(), 1):
        stripped = line.strip()
        m = re.match(r"^(\s*)([A-Za-z][\w./-]*):(\s|$)", line)
        if m and not stripped.startswith("-"):
            ind = len(m.group(1))
            while stack and stack[-1][0] >= ind:
                stack.pop()
            stack.append((ind, m.group(2).strip('"')))
            path = tuple(k for _, k in stack)
            # Keys down to what templates read; keys inside a blob a
            # template passes whole (toYaml) need none.
            if has_path(chart.values, path) and any(r[: len(path)] == path for r in refs):
                c.ok(
                    prev.startswith("#") or " #" in line,
                    f"values.yaml:{lineno}: {'.'.join(path)} has no comment",
                )
        if stripped:
            prev = stripped
    return refs


def docs_of(text, fname, c):
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        c.ok(False, f"{fname}: rendered text is not YAML: {e}")
        return []
    for d in docs:
        c.ok(isinstance(d, dict), f"{fname}: a document is not a mapping")
    return [d for d in docs if isinstance(d, dict)]


DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def objects(rendered, c, scenario):
    objs = []
    for fname, text in rendered.items():
        c.ok("<no value>" not in text, f"[{scenario}] {fname}: '<no value>' in output")
        if fname == "NOTES.txt":
            c.ok(text.strip() != "", f"[{scenario}] NOTES.txt renders empty")
            continue
        for d in docs_of(text, f"[{scenario}] {fname}", c):
            d["__file"] = fname
            objs.append(d)
    seen = set()
    for o in objs:
        where = f"[{scenario}] {o['__file']}"
        kind, meta = o.get("kind"), o.get("metadata") or {}
        name = meta.get("name")
        c.ok(o.get("apiVersion") and kind and name, f"{where}: object without apiVersion/kind/name")
        c.ok(isinstance(name, str) and len(name) <= 63 and DNS1123.match(name or ""),
             f"{where}: {kind} name {name!r} is not a DNS label")
        c.ok((kind, name) not in seen, f"{where}: duplicate {kind}/{name}")
        seen.add((kind, name))
        labels = meta.get("labels") or {}
        for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "helm.sh/chart"):
            c.ok(k in labels, f"{where}: {kind}/{name} lacks label {k}")
        for k, v in labels.items():
            c.ok(isinstance(v, str) and len(v) <= 63, f"{where}: {kind}/{name} label {k}={v!r} is not a short string")
    return objs


def find(objs, kind, pred=lambda o: True):
    return [o for o in objs if o.get("kind") == kind and pred(o)]


def component(o):
    return ((o.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/component")


def env_of(container):
    return {e["name"]: e for e in container.get("env") or []}


def subset(small, big):
    return all(big.get(k) == v for k, v in (small or {}).items())


def check_pod_spec(dep, c, where):
    """What every pod template must satisfy."""
    spec = dep["spec"]["template"]["spec"]
    pod_labels = dep["spec"]["template"]["metadata"].get("labels") or {}
    c.ok(subset(dep["spec"]["selector"]["matchLabels"], pod_labels),
         f"{where}: selector.matchLabels are not all pod labels")
    vols = {v["name"] for v in spec.get("volumes") or []}
    for ct in spec["containers"]:
        names = [e["name"] for e in ct.get("env") or []]
        c.ok(len(names) == len(set(names)), f"{where}: duplicate env names in {ct['name']}")
        for e in ct.get("env") or []:
            c.ok(("value" in e) != ("valueFrom" in e), f"{where}: env {e['name']} needs value xor valueFrom")
            if "value" in e:
                c.ok(isinstance(e["value"], str), f"{where}: env {e['name']} value {e['value']!r} is not a string")
        for m in ct.get("volumeMounts") or []:
            c.ok(m["name"] in vols, f"{where}: mount {m['name']} has no volume")
        c.ok(isinstance(ct.get("image"), str) and ":" in ct["image"], f"{where}: image without tag")
    return spec


def arg_after(args, flag):
    if flag in args and args.index(flag) + 1 < len(args):
        return args[args.index(flag) + 1]
    return None


def port_of(hostport):
    return int(hostport.rsplit(":", 1)[1])


def fullname(values):
    return values["fullnameOverride"] or f"{RELEASE}-{values['nameOverride'] or 'hearth'}"


def data_dir_of(args, env):
    """The data directory a `hearth` command line uses: --data-dir, else
    HEARTH_DATA_DIR, else the default; and whether the two disagree."""
    flag = arg_after(args, "--data-dir")
    var = (env.get("HEARTH_DATA_DIR") or {}).get("value")
    return flag or var or DEFAULT_DATA_DIR, bool(flag and var and flag != var)


def mount_of(ct, path):
    """The mount of a container a path is on (the deepest), or None."""
    best = None
    for m in ct.get("volumeMounts") or []:
        mp = m["mountPath"].rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best["mountPath"].rstrip("/")):
                best = m
    return best


def secret_ref(env, name):
    return (((env.get(name) or {}).get("valueFrom") or {}).get("secretKeyRef")) or None


def value_of(env, name):
    return (env.get(name) or {}).get("value")


def env_str(v):
    """What an env value of the chart must read for a value of values.yaml."""
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def is_uint(s, top=U32):
    return isinstance(s, str) and s.isdigit() and int(s) <= top


def check_objects(objs, values, c, scenario):
    w = f"[{scenario}]"
    sh = values["sandboxHost"]
    auto = sh["autoscaling"]
    cap = sh["capacity"]
    image = f"{values['images']['hearth']['repository']}:{values['images']['hearth']['tag']}"

    hosts = find(objs, "Deployment", lambda o: component(o) == "host")
    controls = find(objs, "Deployment", lambda o: component(o) == "control")
    if not (c.ok(len(hosts) == 1, f"{w} expected one host Deployment, got {len(hosts)}")
            and c.ok(len(controls) == 1, f"{w} expected one control Deployment, got {len(controls)}")):
        return []
    host, control = hosts[0], controls[0]
    host_name = host["metadata"]["name"]
    control_pod_labels = control["spec"]["template"]["metadata"]["labels"]
    host_pod_labels = host["spec"]["template"]["metadata"]["labels"]

    # ---- host Deployment
    hw = f"{w} host Deployment"
    spec = check_pod_spec(host, c, hw)
    c.ok(spec.get("hostNetwork") is True, f"{hw}: hostNetwork is not true")
    c.ok(spec.get("dnsPolicy") == "ClusterFirstWithHostNet", f"{hw}: dnsPolicy must be ClusterFirstWithHostNet (control Service name)")
    c.ok(spec.get("terminationGracePeriodSeconds") == 300 == sh["terminationGracePeriodSeconds"],
         f"{hw}: terminationGracePeriodSeconds is {spec.get('terminationGracePeriodSeconds')}, want 300")
    if auto["enabled"]:
        c.ok("replicas" not in host["spec"], f"{hw}: replicas set although the autoscaler owns it")
    else:
        c.ok(host["spec"].get("replicas") == sh["deployment"]["replicas"], f"{hw}: replicas is not sandboxHost.deployment.replicas")
    strat = host["spec"].get("strategy") or {}
    ru = strat.get("rollingUpdate") or {}
    c.ok(strat.get("type") == "RollingUpdate" and ru.get("maxSurge") == 0 and ru.get("maxUnavailable") == 1,
         f"{hw}: strategy must be RollingUpdate maxSurge 0 maxUnavailable 1, is {strat}")
    terms = (((spec.get("affinity") or {}).get("podAntiAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or [])
    own = [t for t in terms
           if t.get("topologyKey") == "kubernetes.io/hostname"
           and (t.get("labelSelector") or {}).get("matchLabels")
           and subset(t["labelSelector"]["matchLabels"], host_pod_labels)]
    c.ok(own, f"{hw}: no required podAntiAffinity on kubernetes.io/hostname keyed on its own pod labels")
    for t in own:
        ml = t["labelSelector"]["matchLabels"]
        c.ok(ml == host["spec"]["selector"]["matchLabels"], f"{hw}: anti-affinity labels differ from the selector")
        c.ok(not subset(ml, control_pod_labels), f"{hw}: anti-affinity would also match control pods")
    ns = spec.get("nodeSelector") or {}
    c.ok(ns.get(HOST_LABEL) == "true", f"{hw}: nodeSelector lacks {HOST_LABEL}: \"true\"")
    c.ok(ns == sh["nodeSelector"], f"{hw}: nodeSelector is not sandboxHost.nodeSelector")
    tol = [t for t in spec.get("tolerations") or [] if t.get("key") == HOST_LABEL]
    c.ok(any(t.get("effect") == "NoSchedule"
             and (t.get("operator") == "Exists"
                  or (t.get("operator", "Equal") == "Equal" and t.get("value") == ns.get(HOST_LABEL)))
             for t in tol),
         f"{hw}: no toleration for {HOST_LABEL}={ns.get(HOST_LABEL)}:NoSchedule matching the nodeSelector")

    cts = spec["containers"]
    c.ok(len(cts) == 1, f"{hw}: expected one container")
    ct = cts[0]
    c.ok(ct.get("image") == image, f"{hw}: image {ct.get('image')} is not {image}")
    c.ok((ct.get("securityContext") or {}).get("privileged") is True, f"{hw}: container is not privileged")
    c.ok("livenessProbe" not in ct and "startupProbe" not in ct, f"{hw}: a liveness/startup probe would restart it mid-suspend")
    rp = ct.get("readinessProbe") or {}
    c.ok((rp.get("tcpSocket") or {}).get("port") == 19190 == sh["port"], f"{hw}: readinessProbe is not tcpSocket 19190")
    for k, v in (("initialDelaySeconds", 5), ("periodSeconds", 10), ("timeoutSeconds", 3), ("failureThreshold", 3)):
        c.ok(rp.get(k) == v, f"{hw}: readinessProbe {k} is {rp.get(k)}, want {v}")
    ports = ct.get("ports") or []
    c.ok(any(p.get("containerPort") == 19190 and p.get("hostPort") == 19190 for p in ports), f"{hw}: no containerPort/hostPort 19190")
    vols = {v["name"]: v for v in spec.get("volumes") or []}
    mounts = {m["mountPath"]: m for m in ct.get("volumeMounts") or []}
    kvm = mounts.get("/dev/kvm")
    kv = vols.get(kvm["name"]) if kvm else None
    c.ok(kv and kv.get("hostPath") == {"path": "/dev/kvm", "type": "CharDevice"}, f"{hw}: /dev/kvm is not a CharDevice hostPath mount")
    shm = mounts.get("/dev/shm")
    sv = vols.get(shm["name"]) if shm else None
    c.ok(sv and (sv.get("emptyDir") or {}).get("medium") == "Memory"
         and sv["emptyDir"].get("sizeLimit") == sh["shmSizeLimit"],
         f"{hw}: /dev/shm is not a Memory emptyDir sized by sandboxHost.shmSizeLimit")

    env = env_of(ct)
    args = ct.get("args") or []
    c.ok(args[:2] == ["host", "serve"], f"{hw}: args {args} do not start with host serve")
    c.ok(arg_after(args, "--listen") == "0.0.0.0:19190", f"{hw}: --listen is {arg_after(args, '--listen')}")
    adv = arg_after(args, "--advertise") or ""
    m = re.fullmatch(r"\$\((\w+)\):(\d+)", adv)
    c.ok(m and int(m.group(2)) == 19190, f"{hw}: --advertise {adv!r} is not $(VAR):19190")
    if m:
        fr = ((env.get(m.group(1)) or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        c.ok(fr in ("status.podIP", "status.hostIP"), f"{hw}: --advertise's {m.group(1)} is not the pod's/node's IP")

    # The host's data dir: serve's, on the node (hostPath), the same for
    # commands run in the pod (HEARTH_DATA_DIR).
    host_dd, disagree = data_dir_of(args, env)
    c.ok(not disagree, f"{hw}: --data-dir and HEARTH_DATA_DIR disagree")
    c.ok(host_dd == sh["dataDir"], f"{hw}: host serve's data dir is {host_dd}, not sandboxHost.dataDir {sh['dataDir']}")
    c.ok(value_of(env, "HEARTH_DATA_DIR") == sh["dataDir"], f"{hw}: HEARTH_DATA_DIR is not the data dir")
    data = mounts.get(sh["dataDir"])
    dv = vols.get(data["name"]) if data else None
    c.ok(dv and (dv.get("hostPath") or {}).get("path") == sh["dataDir"] and not data.get("readOnly"),
         f"{hw}: data dir is not the writable hostPath {sh['dataDir']}")

    # The preStop drain: the same data dir (the host's id, key and lease
    # epoch) and the same control plane as serve; its token is the
    # container's HEARTH_HOST_TOKEN.
    pre = (((ct.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command") or []
    c.ok(pre[:3] == ["hearth", "host", "drain"], f"{hw}: preStop is {pre}, want hearth host drain …")
    drain_dd, disagree = data_dir_of(pre, env)
    c.ok(not disagree and drain_dd == host_dd, f"{hw}: preStop drain's data dir {drain_dd} is not serve's {host_dd}")
    c.ok(arg_after(pre, "--control") == arg_after(args, "--control"),
         f"{hw}: preStop drain's --control {arg_after(pre, '--control')} is not serve's {arg_after(args, '--control')}")

    # Exactly the host's environment, from values.
    want_env = HOST_ENV | (set(STORE_CREDENTIALS) if values["store"]["existingSecret"] else set())
    c.ok(set(env) == want_env, f"{hw}: env has extra {sorted(set(env) - want_env)}, misses {sorted(want_env - set(env))}")
    c.ok("HEARTH_DATABASE_URL" not in env, f"{hw}: hosts must not get the database URL (they never open the database)")
    c.ok(not {n for n in env if n.startswith("HEARTH_AUTOSCALE_")}, f"{hw}: the autoscaler runs in the control plane, not in hosts")
    c.ok("HEARTH_HOST_LEASE_TTL_SECONDS" not in env, f"{hw}: the lease TTL is the control plane's (told to hosts at registration)")
    want_cpu = str(int(cap["cpuMillicores"])) if cap["cpuMillicores"] not in ("", None) else str(cap["vcpus"] * 8000)
    got_cpu = value_of(env, "HEARTH_HOST_CPU_MILLICORES")
    c.ok(got_cpu == want_cpu, f"{hw}: HEARTH_HOST_CPU_MILLICORES={got_cpu!r}, want {want_cpu!r} (capacity.cpuMillicores, else vcpus × 8000)")
    c.ok(is_uint(got_cpu) and int(got_cpu) > 0, f"{hw}: HEARTH_HOST_CPU_MILLICORES={got_cpu!r} is not a u32 above 0")
    mem = value_of(env, "HEARTH_HOST_MEMORY")
    c.ok(mem == cap["memory"], f"{hw}: HEARTH_HOST_MEMORY={mem!r} is not sandboxHost.capacity.memory")
    c.ok(isinstance(mem, str) and BYTE_SIZE.match(mem), f"{hw}: HEARTH_HOST_MEMORY={mem!r} is no size hearth reads (64GiB, 64G; not 64Gi)")
    ci = value_of(env, "HEARTH_COMMIT_INTERVAL_SECS")
    c.ok(ci == env_str(sh["commitIntervalSeconds"]) and is_uint(ci, 2**64 - 1),
         f"{hw}: HEARTH_COMMIT_INTERVAL_SECS={ci!r} is not sandboxHost.commitIntervalSeconds as a whole number")

    # ---- control plane and the hosts' --control URL
    cw = f"{w} control Deployment"
    cspec = check_pod_spec(control, c, cw)
    c.ok(control["spec"].get("replicas") == values["control"]["replicas"], f"{cw}: replicas is not control.replicas")
    cct = cspec["containers"][0]
    c.ok(cct.get("image") == image, f"{cw}: image is not {image}")
    cargs = cct.get("args") or []
    c.ok(cargs[:1] == ["up"] and "--no-local-host" in cargs, f"{cw}: args {cargs} are not up … --no-local-host")
    listen = arg_after(cargs, "--listen") or ":0"
    c.ok(listen.startswith("0.0.0.0:"), f"{cw}: --listen {listen} is not on every address")
    cports = {p.get("name"): p.get("containerPort") for p in cct.get("ports") or []}
    c.ok(port_of(listen) in cports.values(), f"{cw}: --listen {listen} is no containerPort")
    c.ok("livenessProbe" in cct and "readinessProbe" in cct, f"{cw}: needs liveness and readiness probes")
    c.ok(((cct.get("readinessProbe") or {}).get("httpGet") or {}).get("path") != "/readyz",
         f"{cw}: readiness on /readyz deadlocks (it needs a ready host, which registers through this Service)")
    c.ok((cct.get("securityContext") or {}).get("privileged") is not True, f"{cw}: control plane must not be privileged")
    cenv = env_of(cct)
    c.ok(set(cenv) == CONTROL_ENV, f"{cw}: env has extra {sorted(set(cenv) - CONTROL_ENV)}, misses {sorted(CONTROL_ENV - set(cenv))}")
    db = secret_ref(cenv, "HEARTH_DATABASE_URL")
    if c.ok(db, f"{cw}: HEARTH_DATABASE_URL is not from a Secret"):
        if values["database"]["url"]:
            s = find(objs, "Secret", lambda o: o["metadata"]["name"] == db["name"])
            c.ok(s and (s[0].get("stringData") or {}).get(db["key"]) == values["database"]["url"],
                 f"{cw}: the database Secret {db['name']} does not hold database.url under {db['key']}")
        else:
            c.ok(db == {"name": values["database"]["existingSecret"], "key": values["database"]["existingSecretKey"]},
                 f"{cw}: HEARTH_DATABASE_URL is not database.existingSecret/existingSecretKey")
        c.ok(not [e for e in env.values() if (((e.get("valueFrom") or {}).get("secretKeyRef") or {}).get("name")) == db["name"]],
             f"{hw}: hosts must not read the database Secret {db['name']}")
    for k in ("HEARTH_STORE_URL",) + STORE_CREDENTIALS:
        c.ok(k not in cenv, f"{cw}: {k} set, but the control plane (--no-local-host) never opens the store")

    # The control plane's settings of the hosts' leases.
    ttl = value_of(cenv, "HEARTH_HOST_LEASE_TTL_SECONDS")
    c.ok(ttl == env_str(sh["leaseTtlSeconds"]), f"{cw}: HEARTH_HOST_LEASE_TTL_SECONDS={ttl!r} is not sandboxHost.leaseTtlSeconds")
    c.ok(is_uint(ttl, 2**64 - 1) and 2 <= int(ttl) <= 3600, f"{cw}: HEARTH_HOST_LEASE_TTL_SECONDS={ttl!r} is outside 2..3600 (hearth clamps it)")
    grace = value_of(cenv, "HEARTH_FAILOVER_GRACE_SECONDS")
    c.ok(grace == env_str(sh["failoverGraceSeconds"]), f"{cw}: HEARTH_FAILOVER_GRACE_SECONDS={grace!r} is not sandboxHost.failoverGraceSeconds")
    c.ok(is_uint(grace, 2**64 - 1) and int(grace) <= 3600, f"{cw}: HEARTH_FAILOVER_GRACE_SECONDS={grace!r} is above 3600 (hearth caps it)")

    # The host autoscaler: the control plane's, from sandboxHost.autoscaling.
    for name, key in AUTOSCALE_ENV.items():
        if key is not None:
            want = env_str(auto[key])
            got = value_of(cenv, name)
            c.ok(got == want, f"{cw}: {name}={got!r}, want {want!r} (sandboxHost.autoscaling.{key})")
            if key != "enabled":
                c.ok(is_uint(got), f"{cw}: {name}={got!r} is not a u32")
    c.ok(value_of(cenv, "HEARTH_AUTOSCALE_ENABLED") in ("true", "false"), f"{cw}: HEARTH_AUTOSCALE_ENABLED is not true/false")
    # hearth_fleet::AutoscalePolicy::validate, which refuses to start otherwise.
    c.ok(1 <= auto["maxReplicas"] and auto["minReplicas"] <= auto["maxReplicas"] and 1 <= auto["targetUtilizationPercent"] <= 100,
         f"{w} autoscaling: want 1 <= maxReplicas, minReplicas <= maxReplicas, targetUtilizationPercent in 1..100")
    hc = value_of(cenv, "HEARTH_AUTOSCALE_HOST_CPU_MILLICORES")
    c.ok(hc == str(cap["vcpus"] * 1000) and is_uint(hc) and int(hc) > 0,
         f"{cw}: HEARTH_AUTOSCALE_HOST_CPU_MILLICORES={hc!r}, want sandboxHost.capacity.vcpus × 1000 = {cap['vcpus'] * 1000}")
    c.ok(value_of(cenv, "HEARTH_AUTOSCALE_BACKEND") == "kubernetes", f"{cw}: HEARTH_AUTOSCALE_BACKEND is not kubernetes")
    c.ok(value_of(cenv, "HEARTH_AUTOSCALE_DEPLOYMENT") == host_name, f"{cw}: HEARTH_AUTOSCALE_DEPLOYMENT is not {host_name}")
    c.ok(((cenv.get("HEARTH_AUTOSCALE_NAMESPACE") or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace",
         f"{cw}: HEARTH_AUTOSCALE_NAMESPACE is not the downward API's metadata.namespace")

    # A writable data dir: `<data-dir>/control.key` is created on first start.
    cdd, disagree = data_dir_of(cargs, cenv)
    c.ok(not disagree, f"{cw}: --data-dir and HEARTH_DATA_DIR disagree")
    dm = mount_of(cct, cdd)
    if c.ok(dm, f"{cw}: data dir {cdd} is on no volume (control.key must be written)"):
        vol = [v for v in cspec.get("volumes") or [] if v["name"] == dm["name"]]
        c.ok(not dm.get("readOnly") and vol and ("emptyDir" in vol[0] or "persistentVolumeClaim" in vol[0]),
             f"{cw}: data dir {cdd} is not on a writable emptyDir or PersistentVolumeClaim")
        # A claim (ReadWriteOnce) would be one volume for every replica.
        c.ok(values["control"]["replicas"] == 1 or (vol and "persistentVolumeClaim" not in vol[0]),
             f"{cw}: several replicas cannot share the data dir's PersistentVolumeClaim (each has its own key)")
        c.ok(dm.get("mountPath") != "/etc/hearth/master-key", f"{cw}: data dir is the master key's mount")

    services = find(objs, "Service", lambda o: component(o) == "control")
    if c.ok(len(services) == 1, f"{w} expected one control Service"):
        svc = services[0]
        sel = svc["spec"].get("selector") or {}
        c.ok(sel and subset(sel, control_pod_labels), f"{w} control Service selects no control pod")
        c.ok(not subset(sel, host_pod_labels), f"{w} control Service would select host pods")
        for what, cmd in (("host serve", args), ("preStop drain", pre)):
            url = arg_after(cmd, "--control") or ""
            um = re.fullmatch(r"http://([a-z0-9.-]+):(\d+)", url)
            if not c.ok(um, f"{hw}: {what} --control {url!r} is not http://host:port"):
                continue
            c.ok(um.group(1) in (svc["metadata"]["name"], f"{svc['metadata']['name']}.{NAMESPACE}.svc",
                                 f"{svc['metadata']['name']}.{NAMESPACE}.svc.cluster.local"),
                 f"{hw}: {what} --control host {um.group(1)} is not the control Service")
            sports = svc["spec"].get("ports") or []
            match = [p for p in sports if p.get("port") == int(um.group(2))]
            c.ok(match, f"{hw}: {what} --control port {um.group(2)} is not a port of Service {svc['metadata']['name']}")
            for p in match:
                tp = p.get("targetPort", p.get("port"))
                target = cports.get(tp) if isinstance(tp, str) else tp
                c.ok(target == port_of(listen), f"{w} Service port {p['port']} targets {tp}, not the control's --listen port")
        public = values["publicUrl"] or arg_after(args, "--control")
        c.ok(value_of(cenv, "HEARTH_PUBLIC_URL") == public, f"{cw}: HEARTH_PUBLIC_URL is not {public}")

    # ---- shared: log filter, master key, enrollment token; the hosts' store
    for ew, e in ((hw, env), (cw, cenv)):
        c.ok(value_of(e, "HEARTH_LOG") == values["logLevel"], f"{ew}: HEARTH_LOG is not logLevel")
    c.ok(value_of(env, "HEARTH_STORE_URL") == values["store"]["url"], f"{hw}: HEARTH_STORE_URL is not store.url")
    for k in STORE_CREDENTIALS:
        if values["store"]["existingSecret"]:
            c.ok(secret_ref(env, k) == {"name": values["store"]["existingSecret"], "key": k}, f"{hw}: {k} is not from store.existingSecret")
    for dep, ctr, ew in ((host, ct, hw), (control, cct, cw)):
        e = env_of(ctr)
        keyfile = value_of(e, "HEARTH_MASTER_KEY_FILE") or ""
        dspec = dep["spec"]["template"]["spec"]
        mount = [m for m in ctr.get("volumeMounts") or [] if keyfile.startswith(m["mountPath"].rstrip("/") + "/")]
        if c.ok(mount, f"{ew}: HEARTH_MASTER_KEY_FILE {keyfile!r} is under no mount"):
            vol = [v for v in dspec.get("volumes") or [] if v["name"] == mount[0]["name"]][0]
            sec = vol.get("secret") or {}
            rel = keyfile[len(mount[0]["mountPath"].rstrip("/")) + 1 :]
            want_name = values["masterKey"]["existingSecret"] or f"{fullname(values)}-master-key"
            want_key = values["masterKey"]["existingSecretKey"] if values["masterKey"]["existingSecret"] else "master.key"
            c.ok(sec.get("secretName") == want_name, f"{ew}: master key from {sec.get('secretName')}, want {want_name}")
            c.ok(sec.get("items") == [{"key": want_key, "path": rel}], f"{ew}: master key items {sec.get('items')} do not give {rel}")
            c.ok(sec.get("defaultMode") == 0o400, f"{ew}: master key mode must be 0400 (hearth refuses group/other bits)")
            c.ok(mount[0].get("readOnly") is True, f"{ew}: the master key mount is not read-only")
    c.ok(value_of(env, "HEARTH_MASTER_KEY_FILE") == value_of(cenv, "HEARTH_MASTER_KEY_FILE"),
         f"{w} control plane and hosts read the master key from different paths")
    mk = find(objs, "Secret", lambda o: o["metadata"]["name"] == f"{fullname(values)}-master-key")
    if values["masterKey"]["existingSecret"]:
        c.ok(not mk, f"{w} a master key Secret is generated although masterKey.existingSecret is set")
    elif c.ok(len(mk) == 1, f"{w} no generated master key Secret"):
        raw = base64.b64decode((mk[0].get("data") or {}).get("master.key", ""))
        c.ok(len(raw) == 32, f"{w} generated master key is {len(raw)} bytes, hearth needs 32")
        c.ok((mk[0]["metadata"].get("annotations") or {}).get("helm.sh/resource-policy") == "keep",
             f"{w} master key Secret is not kept on uninstall")

    # The enrollment token: one Secret feeds both components.
    tok = values["hostToken"]
    want_tok = ({"name": tok["existingSecret"], "key": tok["existingSecretKey"]} if tok["existingSecret"]
                else {"name": f"{fullname(values)}-host-token", "key": "token"})
    for ew, e in ((hw, env), (cw, cenv)):
        c.ok(secret_ref(e, "HEARTH_HOST_TOKEN") == want_tok, f"{ew}: HEARTH_HOST_TOKEN is {secret_ref(e, 'HEARTH_HOST_TOKEN')}, want {want_tok}")
    ts = find(objs, "Secret", lambda o: o["metadata"]["name"] == f"{fullname(values)}-host-token")
    if tok["existingSecret"]:
        c.ok(not ts, f"{w} a host token Secret is generated although hostToken.existingSecret is set")
    elif c.ok(len(ts) == 1, f"{w} no generated host token Secret"):
        raw = base64.b64decode((ts[0].get("data") or {}).get("token", ""))
        c.ok(len(raw) >= 32 and raw.decode().isalnum(), f"{w} generated host token is {len(raw)} bytes, want 32 or more alphanumerics")

    # ---- RBAC: the control plane scales the host Deployment; hosts have none.
    sa = spec.get("serviceAccountName")
    csa = cspec.get("serviceAccountName")
    c.ok(find(objs, "ServiceAccount", lambda o: o["metadata"]["name"] == sa), f"{hw}: ServiceAccount {sa} is not rendered")
    c.ok(find(objs, "ServiceAccount", lambda o: o["metadata"]["name"] == csa), f"{cw}: ServiceAccount {csa} is not rendered")
    c.ok(csa != sa, f"{cw}: the control plane must not use the hosts' ServiceAccount")
    c.ok(spec.get("automountServiceAccountToken") is False, f"{hw}: hosts never call the Kubernetes API: no token")
    c.ok(cspec.get("automountServiceAccountToken") is bool(auto["enabled"]),
         f"{cw}: automountServiceAccountToken is {cspec.get('automountServiceAccountToken')}, want {bool(auto['enabled'])} (only the autoscaler needs it)")
    for o in find(objs, "ServiceAccount"):
        c.ok(o.get("automountServiceAccountToken") is False, f"{w} ServiceAccount {o['metadata']['name']} mounts its token by default")
    roles = find(objs, "Role")
    bindings = find(objs, "RoleBinding")
    for rb in bindings:
        c.ok(not [s for s in rb.get("subjects") or [] if s.get("name") == sa],
             f"{w} RoleBinding {rb['metadata']['name']} binds the hosts' ServiceAccount (hosts need no RBAC)")
    if auto["enabled"]:
        if c.ok(len(roles) == 1, f"{w} expected one Role (the control plane's), got {len(roles)}"):
            role = roles[0]
            got = set()
            names = set()
            for rule in role.get("rules") or []:
                c.ok(rule.get("resourceNames"), f"{w} a Role rule is not restricted by resourceNames")
                for g in rule.get("apiGroups") or []:
                    for res in rule.get("resources") or []:
                        for verb in rule.get("verbs") or []:
                            got.add((g, res, verb))
                names |= set(rule.get("resourceNames") or [])
            c.ok(got == CONTROL_RBAC, f"{w} Role grants {sorted(got - CONTROL_RBAC)} extra, misses {sorted(CONTROL_RBAC - got)}")
            c.ok(names == {host_name} == {value_of(cenv, "HEARTH_AUTOSCALE_DEPLOYMENT")},
                 f"{w} Role resourceNames {sorted(names)} are not the host Deployment {host_name}")
            if c.ok(len(bindings) == 1, f"{w} expected one RoleBinding"):
                rb = bindings[0]
                c.ok(rb.get("roleRef") == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]},
                     f"{w} RoleBinding does not reference the Role")
                c.ok(rb.get("subjects") == [{"kind": "ServiceAccount", "name": csa, "namespace": NAMESPACE}],
                     f"{w} RoleBinding subjects {rb.get('subjects')} are not the control plane's ServiceAccount {csa}")
    else:
        c.ok(not roles and not bindings, f"{w} Role/RoleBinding rendered although autoscaling is off")
    c.ok(not find(objs, "ClusterRole") and not find(objs, "ClusterRoleBinding"), f"{w} no cluster-wide RBAC expected")

    # ---- PodDisruptionBudgets: the hosts' and the control plane's
    pdbs = find(objs, "PodDisruptionBudget", lambda o: component(o) == "host")
    if sh["pdb"]["enabled"]:
        if c.ok(len(pdbs) == 1, f"{w} pdb.enabled but no PodDisruptionBudget"):
            p = pdbs[0]
            c.ok(p["spec"].get("maxUnavailable") == sh["pdb"]["maxUnavailable"] == 1, f"{w} PDB maxUnavailable is not 1")
            c.ok(p["spec"]["selector"]["matchLabels"] == host["spec"]["selector"]["matchLabels"], f"{w} PDB does not select the host pods")
    else:
        c.ok(not pdbs, f"{w} PodDisruptionBudget rendered although sandboxHost.pdb.enabled is false")
    c.ok(len(find(objs, "PodDisruptionBudget")) == len(pdbs) + len(find(objs, "PodDisruptionBudget", lambda o: component(o) == "control")),
         f"{w} a PodDisruptionBudget of neither the hosts nor the control plane")
    check_control_replicas(control, find(objs, "PodDisruptionBudget", lambda o: component(o) == "control"),
                           host_pod_labels, values, c, w)

    kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objs)
    return kinds


def check_control_replicas(control, pdbs, host_pod_labels, values, c, w):
    """Several control-plane replicas, kept serving: the Deployment's
    replicas, a rollout that never goes below them, anti-affinity spreading
    them over nodes, and a PodDisruptionBudget letting drains take one."""
    cw = f"{w} control Deployment"
    cv = values["control"]
    spec = control["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    c.ok(spec.get("replicas") == cv["replicas"], f"{cw}: replicas {spec.get('replicas')} is not control.replicas {cv['replicas']}")
    strat = spec.get("strategy") or {}
    ru = strat.get("rollingUpdate") or {}
    c.ok(strat.get("type") == "RollingUpdate" and ru.get("maxUnavailable") == 0 and ru.get("maxSurge") == 1,
         f"{cw}: strategy must be RollingUpdate maxSurge 1 maxUnavailable 0 (never below the replicas asked for), is {strat}")
    aff = ((spec["template"]["spec"].get("affinity") or {}).get("podAntiAffinity") or {})
    c.ok(not aff.get("requiredDuringSchedulingIgnoredDuringExecution"),
         f"{cw}: required anti-affinity would leave replicas Pending on a small cluster")
    terms = [t.get("podAffinityTerm") or {} for t in aff.get("preferredDuringSchedulingIgnoredDuringExecution") or []]
    own = [t for t in terms
           if t.get("topologyKey") == "kubernetes.io/hostname"
           and subset((t.get("labelSelector") or {}).get("matchLabels"), pod_labels)
           and (t.get("labelSelector") or {}).get("matchLabels")]
    c.ok(own, f"{cw}: no preferred podAntiAffinity on kubernetes.io/hostname keyed on its own pod labels")
    for t in own:
        ml = t["labelSelector"]["matchLabels"]
        c.ok(ml == spec["selector"]["matchLabels"], f"{cw}: anti-affinity labels differ from the selector")
        c.ok(not subset(ml, host_pod_labels), f"{cw}: anti-affinity would also match host pods")
    if cv["pdb"]["enabled"]:
        if c.ok(len(pdbs) == 1, f"{w} control.pdb.enabled but no control PodDisruptionBudget"):
            p = pdbs[0]["spec"]
            c.ok(p.get("maxUnavailable") == cv["pdb"]["maxUnavailable"] and "minAvailable" not in p,
                 f"{w} control PDB is {p}, want maxUnavailable {cv['pdb']['maxUnavailable']} only")
            c.ok(p["selector"]["matchLabels"] == spec["selector"]["matchLabels"], f"{w} control PDB does not select the control pods")
            c.ok(not subset(p["selector"]["matchLabels"], host_pod_labels), f"{w} control PDB would also select host pods")
            # Serving through a drain: at least one replica left.
            c.ok(cv["replicas"] - p.get("maxUnavailable", 0) >= 1 or cv["replicas"] == 1,
                 f"{w} control PDB lets a drain take every replica")
    else:
        c.ok(not pdbs, f"{w} control PodDisruptionBudget rendered although control.pdb.enabled is false")


SCENARIOS = {
    "defaults": {},
    "autoscaling": {
        "sandboxHost": {
            "autoscaling": {
                "enabled": True,
                "minReplicas": 3,
                "maxReplicas": 17,
                "targetUtilizationPercent": 65,
                "headroomHosts": 2,
                "scaleDownStabilizationSeconds": 120,
            },
            # × 8000 and × 1000 past 1e6: printed as integers, not 1e+06.
            "capacity": {"vcpus": 128},
        }
    },
    "pdb": {"sandboxHost": {"pdb": {"enabled": True}}},
    # One control-plane pod, no control PDB (the branches the defaults skip).
    "single-replica": {"control": {"replicas": 1, "pdb": {"enabled": False}}},
    # Every other branch of the templates: inline database URL, existing
    # secrets, public URL, pull secrets, annotations, placement knobs, an
    # explicit host CPU capacity (past 1e6), the control plane's lease
    # settings.
    "other-branches": {
        "nameOverride": "sbx",
        "publicUrl": "https://sandboxes.example.com",
        "logLevel": "debug",
        "database": {"url": "postgres://hearth:pw@db:5432/hearth"},
        "masterKey": {"existingSecret": "my-master-key", "existingSecretKey": "key"},
        "hostToken": {"existingSecret": "my-host-token", "existingSecretKey": "enroll"},
        "store": {"existingSecret": "s3-creds"},
        "images": {"pullSecrets": [{"name": "regcred"}]},
        "control": {
            "nodeSelector": {"pool": "system"},
            "tolerations": [{"key": "system", "operator": "Exists"}],
            "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/c"}},
        },
        "sandboxHost": {
            "leaseTtlSeconds": 20,
            "failoverGraceSeconds": 45,
            "capacity": {"vcpus": 8, "cpuMillicores": 2000000, "memory": "256GiB"},
            "commitIntervalSeconds": 15,
            "priorityClassName": "system-node-critical",
            "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/h"}},
        },
    },
}


def check_renders(chart, c):
    c.section("rendering (tiny renderer): " + ", ".join(SCENARIOS) + ", upgrade with an installed master key and host token")
    results = {}
    for name, over in SCENARIOS.items():
        values_over = deep_merge(REQUIRED_VALUES, over)
        try:
            rendered, r, values = chart.render(values_over)
        except TemplateError as e:
            c.ok(False, f"[{name}] render failed: {e}")
            continue
        for path in r.values_read:
            c.ok(has_path(values, path) or not path, f"[{name}] renderer read .Values.{'.'.join(path)}, not in values")
        objs = objects(rendered, c, name)
        kinds = check_objects(objs, values, c, name)
        results[name] = (values_over, kinds)

    # An upgrade must reuse the installed master key and host token (lookup
    # finds them); a fresh install generates new ones each render.
    installed = base64.b64encode(b"k" * 32).decode()
    token = base64.b64encode(b"t" * 48).decode()
    fixture = {
        ("v1", "Secret", NAMESPACE, f"{RELEASE}-hearth-master-key"): {"data": {"master.key": installed}},
        ("v1", "Secret", NAMESPACE, f"{RELEASE}-hearth-host-token"): {"data": {"token": token}},
    }
    try:
        rendered, _, _ = chart.render(REQUIRED_VALUES, lookups=fixture)
        objs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(rendered["secrets.yaml"]) if d}
        key = objs.get(f"{RELEASE}-hearth-master-key") or {}
        c.ok((key.get("data") or {}).get("master.key") == installed, "[upgrade] the installed master key is not reused")
        tok = objs.get(f"{RELEASE}-hearth-host-token") or {}
        c.ok((tok.get("data") or {}).get("token") == token, "[upgrade] the installed host token is not reused")
    except TemplateError as e:
        c.ok(False, f"[upgrade] render failed: {e}")

    c.section("the defaults run 3 control replicas with a PodDisruptionBudget")
    defaults = results.get("defaults")
    if c.ok(defaults, "[defaults] did not render"):
        kinds = defaults[1]
        c.ok(chart.values["control"]["replicas"] == 3, f"values.yaml: control.replicas is {chart.values['control']['replicas']}, want 3")
        c.ok(f"PodDisruptionBudget/{RELEASE}-hearth-control" in kinds, f"[defaults] no control PodDisruptionBudget in {kinds}")

    c.section("control.replicas > 1 without an external PostgreSQL fails the render (fail), one replica does not")
    no_db = {"database": {"url": "", "existingSecret": ""}}
    sqlite = {"database": {"url": "sqlite:///var/lib/hearth/hearth.db"}}
    for name, over, refused, says in (
        ("3 replicas, no database", no_db, True, "database.existingSecret"),
        ("2 replicas, no database", deep_merge(no_db, {"control": {"replicas": 2}}), True, "database.existingSecret"),
        ("3 replicas, SQLite url", sqlite, True, "postgres://"),
        ("3 replicas, postgresql:// url", {"database": {"url": "postgresql://h:pw@db/hearth"}}, False, None),
        ("3 replicas, existing Secret", {"database": {"url": "", "existingSecret": "pg"}}, False, None),
        ("1 replica, SQLite url", deep_merge(sqlite, {"control": {"replicas": 1}}), False, None),
    ):
        try:
            chart.render(deep_merge(REQUIRED_VALUES, over))
            c.ok(not refused, f"[{name}] rendered, but must fail: several replicas need PostgreSQL")
        except FailError as e:
            c.ok(refused, f"[{name}] refused, but must render: {e}")
            c.ok(says in str(e) and "control.replicas" in str(e) and "PostgreSQL" in str(e),
                 f"[{name}] the refusal does not say what to do: {e}")
        except TemplateError as e:
            c.ok(False, f"[{name}] failed, but not through fail: {e}")
    try:
        chart.render(deep_merge(REQUIRED_VALUES, deep_merge(no_db, {"control": {"replicas": 1}})))
        c.ok(False, "[1 replica, no database] rendered without a database URL")
    except RequiredError as e:
        c.ok("database.existingSecret" in str(e), f"[1 replica, no database] required error does not name it: {e}")
    except TemplateError as e:
        c.ok(False, f"[1 replica, no database] failed, but not through required: {e}")

    c.section("required values fail the render: images.hearth.tag, store.url")
    for path, over in (
        ("images.hearth.tag", {"store": REQUIRED_VALUES["store"]}),
        ("store.url", {"images": REQUIRED_VALUES["images"]}),
    ):
        try:
            chart.render(over)
            c.ok(False, f"rendering without {path} succeeded")
        except RequiredError as e:
            c.ok(path in str(e), f"required error without {path} does not name it: {e}")
        except TemplateError as e:
            c.ok(False, f"rendering without {path} failed, but not through required: {e}")
    return results


def code_text(path):
    """A source file without its unit tests (the `#[cfg(test)]` module at
    its end), so a name only a test mentions does not count."""
    text = path.read_text()
    cut = text.find("#[cfg(test)]")
    return text if cut < 0 else text[:cut]


def const_strs(text, name):
    m = re.search(rf"\bconst {name}\b[^=]*=\s*\[(.*?)\];", text, re.S)
    return re.findall(r'"([^"]+)"', m.group(1)) if m else None


def check_sources(c):
    """Holds the contract this script checks the chart against to the code:
    every environment variable the chart sets is one hearth reads, the
    autoscaler's names are hearth_fleet's own lists, the flags exist, and the
    Kubernetes backend needs no more than CONTROL_RBAC."""
    crates = REPO / "crates"
    cli = crates / "hearth-cli" / "src"
    if not (cli / "main.rs").is_file():
        print(f"SKIP: no sources at {crates}: the chart's names are not checked against the code")
        return False
    c.section("the chart's contract against the code (hearth-cli, hearth-fleet)")
    files = sorted(p for p in crates.glob("*/src/**/*.rs"))
    code = "\n".join(code_text(p) for p in files)
    for name in sorted((CONTROL_ENV | HOST_ENV) - {"POD_IP"}):
        if name.startswith("HEARTH_"):
            c.ok(f'"{name}"' in code, f"code: no crate's source reads {name}, which the chart sets")
    autoscale = code_text(crates / "hearth-fleet" / "src" / "autoscale.rs")
    policy = const_strs(autoscale, "ENV_VARS")
    backend = const_strs(autoscale, "BACKEND_ENV_VARS")
    if c.ok(policy and backend, "code: hearth-fleet's ENV_VARS / BACKEND_ENV_VARS not found"):
        named = {k for k, v in AUTOSCALE_ENV.items() if v is not None}
        c.ok(set(policy) == named, f"code: hearth_fleet ENV_VARS {policy} are not the chart's valued autoscale env {sorted(named)}")
        c.ok(set(backend) <= set(AUTOSCALE_ENV), f"code: BACKEND_ENV_VARS {backend} are not all set by the chart")
        rest = set(AUTOSCALE_ENV) - set(policy) - set(backend)
        fleet = code_text(cli / "fleet.rs")
        c.ok(all(f'"{n}"' in fleet for n in rest), f"code: fleet.rs reads none of {sorted(rest)}")
    main = code_text(cli / "main.rs")
    m = re.search(r'env = "HEARTH_DATA_DIR",\s*default_value = "([^"]+)"', main)
    c.ok(m and m.group(1) == DEFAULT_DATA_DIR, f"code: --data-dir's default is {m and m.group(1)}, not {DEFAULT_DATA_DIR}")
    up = code_text(cli / "up.rs")
    # The flags the chart passes, as clap fields (kebab-case of the field).
    for text, fields, where in (
        (main, ("data_dir", "listen", "control", "advertise"), "main.rs (Cli, host serve/drain)"),
        (up, ("listen", "no_local_host"), "up.rs (UpArgs)"),
    ):
        for f in fields:
            c.ok(re.search(rf"\b{f}:\s", text), f"code: {where} has no argument {f} (--{f.replace('_', '-')})")
    c.ok(re.search(r"\bServe\s*\{", main) and re.search(r"\bDrain\s*\{", main) and "Up(" in main,
         "code: main.rs lacks the up / host serve / host drain commands")
    c.ok('"HEARTH_HOST_TOKEN"' in code_text(cli / "fleet.rs") and '"control"' in code_text(cli / "up.rs"),
         "code: the enrollment token's variable or the control plane's signing key (control.key) moved")
    kube = code_text(crates / "hearth-fleet" / "src" / "backend" / "kube.rs")
    # Every request it makes is the client's method on `self.url()`, the
    # Deployment's scale subresource.
    calls = set(re.findall(r"self\.client\s*\.\s*(\w+)\(", kube))
    on_scale = re.findall(r"self\.client\s*\.\s*\w+\(([^)]*)\)", kube)
    c.ok(calls == {"get", "patch"} and all(a.strip() == "self.url(" for a in on_scale)
         and re.search(r'"\{\}/apis/apps/v1/namespaces/\{\}/deployments/\{\}/scale"', kube),
         f"code: the Kubernetes backend calls {sorted(calls)} on {on_scale}; CONTROL_RBAC grants deployments/scale get and patch only")
    return True


def check_helm(results, c):
    helm = shutil.which("helm")
    if not helm:
        print("SKIP: no helm on PATH: helm lint / helm template not run")
        return False
    c.section("helm lint and helm template vs the tiny renderer")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (over, kinds) in results.items():
            vf = Path(tmp) / f"{name}.yaml"
            vf.write_text(yaml.safe_dump(over))
            lint = subprocess.run([helm, "lint", str(CHART), "-f", str(vf)], capture_output=True, text=True)
            c.ok(lint.returncode == 0, f"[{name}] helm lint failed:\n{lint.stdout}{lint.stderr}")
            tpl = subprocess.run(
                [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(vf)],
                capture_output=True, text=True,
            )
            if not c.ok(tpl.returncode == 0, f"[{name}] helm template failed:\n{tpl.stderr}"):
                continue
            theirs = sorted(
                f"{d['kind']}/{d['metadata']['name']}" for d in yaml.safe_load_all(tpl.stdout) if d
            )
            c.ok(theirs == kinds, f"[{name}] helm template gives {theirs}, the tiny renderer {kinds}")
        vf = Path(tmp) / "no-tag.yaml"
        vf.write_text(yaml.safe_dump({"store": REQUIRED_VALUES["store"]}))
        tpl = subprocess.run([helm, "template", RELEASE, str(CHART), "-f", str(vf)], capture_output=True, text=True)
        c.ok(tpl.returncode != 0 and "images.hearth.tag" in tpl.stderr, "helm template without images.hearth.tag did not fail on it")
        vf = Path(tmp) / "replicas-no-postgres.yaml"
        vf.write_text(yaml.safe_dump(deep_merge(REQUIRED_VALUES, {"database": {"url": "sqlite:///x.db"}})))
        tpl = subprocess.run([helm, "template", RELEASE, str(CHART), "-f", str(vf)], capture_output=True, text=True)
        c.ok(tpl.returncode != 0 and "PostgreSQL" in tpl.stderr, "helm template with 3 replicas on SQLite did not fail on it")
    return True


def main():
    c = Checks()
    try:
        chart = Chart(CHART)
    except TemplateError as e:
        print(f"FAIL: the chart does not parse: {e}")
        return 1
    dump = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--dump=")]
    if dump:
        rendered, _, _ = chart.render(deep_merge(REQUIRED_VALUES, SCENARIOS[dump[0]]))
        for name, text in rendered.items():
            print(f"# ---- {name}\n{text}")
        return 0
    c.section(f"templates parse within the subset ({len(chart.files)} files, {len(chart.defines)} defines)")
    c.section("Chart.yaml and the chart's files")
    m = chart.meta
    c.ok(m.get("apiVersion") == "v2" and m.get("name") == "hearth", "Chart.yaml: apiVersion v2, name hearth")
    c.ok(isinstance(m.get("appVersion"), str) and m.get("version"), "Chart.yaml: appVersion (a string) and version")
    for f in ("README.md", "values.yaml", "templates/_helpers.tpl", "templates/NOTES.txt"):
        c.ok((CHART / f).is_file(), f"the chart lacks {f}")
    refs = check_values(chart, c)
    results = check_renders(chart, c)
    check_sources(c)
    ran_helm = check_helm(results, c)

    print(f"Hearth chart {chart.meta['version']} (app {chart.meta['appVersion']}):")
    for s in c.sections:
        print(f"  - {s}")
    print(f"  {len(refs)} distinct .Values paths read; {len(list(leaves(chart.values)))} leaves in values.yaml")
    for name, (_, kinds) in results.items():
        print(f"  [{name}] {len(kinds)} objects: {', '.join(kinds)}")
    if not ran_helm:
        print("  helm: skipped (not installed)")
    if c.failures:
        print(f"FAIL: {len(c.failures)} of {c.count} checks failed:")
        for f in c.failures:
            print(f"  * {f}")
        return 1
    print(f"OK: {c.count} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
