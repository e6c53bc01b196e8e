#!/usr/bin/env python3
"""Static consistency test of the Hearth Helm chart (deploy/helm/hearth).

Needs Python 3 and PyYAML (Debian: python3-yaml); no helm, no cluster.

1. values: every `.Values.a.b` a template reads exists in values.yaml, every
   leaf of values.yaml is read by some template (unless ALLOWED_UNUSED says
   why not), and every key of values.yaml has a comment.
2. rendering: a small renderer for the subset of Go templates the chart
   keeps to (see templates/_helpers.tpl) renders every template for several
   sets of values; each must give valid YAML, and the objects are checked
   against what Hearth's design needs (host pool, RBAC, wiring between the
   control plane and the hosts, secrets). `required` values must fail the
   render when unset.
3. helm: when a `helm` binary is on PATH, `helm lint` and `helm template`
   run too and must produce the same objects (kinds and names).

Exit status 0 when everything holds; a summary is printed either way.

    python3 deploy/helm/test_chart.py [CHART_DIR] [--dump=SCENARIO]

--dump prints what the tiny renderer makes of the chart for one scenario
(defaults, autoscaling, pdb, other-branches) and exits.
"""

import base64
import copy
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

AUTOSCALE_ENV = {
    "HEARTH_AUTOSCALE_ENABLED": "enabled",
    "HEARTH_AUTOSCALE_MIN_REPLICAS": "minReplicas",
    "HEARTH_AUTOSCALE_MAX_REPLICAS": "maxReplicas",
    "HEARTH_AUTOSCALE_TARGET_UTILIZATION_PERCENT": "targetUtilizationPercent",
    "HEARTH_AUTOSCALE_HEADROOM_HOSTS": "headroomHosts",
    "HEARTH_AUTOSCALE_SCALE_DOWN_STABILIZATION_SECONDS": "scaleDownStabilizationSeconds",
    "HEARTH_AUTOSCALE_BACKEND": None,
    "HEARTH_AUTOSCALE_DEPLOYMENT": None,
    "HEARTH_AUTOSCALE_NAMESPACE": None,
}

HOST_LABEL = "hearth.dev/host"


# --------------------------------------------------------------------------
# A renderer for the chart's subset of Go templates (text/template + the few
# Sprig/Helm functions listed in _helpers.tpl).
# --------------------------------------------------------------------------


class TemplateError(Exception):
    pass


class RequiredError(TemplateError):
    pass


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
        return str(int(v)) if v.is_integer() else repr(v)
    if isinstance(v, str):
        return v
    raise TemplateError(f"{where}: printing a {type(v).__name__} ({v!r}); use toYaml")


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
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True, allow_unicode=True).rstrip("\n")


def indent(n, s):
    pad = " " * n
    return pad + s.replace("\n", "\n" + pad)


def helm_trunc(n, s):
    if n < 0 and len(s) + n > 0:
        return s[len(s) + n :]
    if n >= 0 and len(s) > n:
        return s[:n]
    return s


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
        }

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
        """Renders every template; returns ({file: text}, Renderer)."""
        values = deep_merge(self.values, overrides)
        r = Renderer(self.defines, lookups)
        dot = self.context(values)
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


def check_objects(objs, values, c, scenario):
    w = f"[{scenario}]"
    sh = values["sandboxHost"]
    auto = sh["autoscaling"]
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
    pre = (((ct.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command")
    c.ok(pre == ["hearth", "host", "drain"], f"{hw}: preStop is {pre}, want hearth host drain")
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
    data = mounts.get(sh["dataDir"])
    dv = vols.get(data["name"]) if data else None
    c.ok(dv and (dv.get("hostPath") or {}).get("path") == sh["dataDir"], f"{hw}: data dir is not the hostPath {sh['dataDir']}")

    env = env_of(ct)
    c.ok((env.get("HEARTH_DATA_DIR") or {}).get("value") == sh["dataDir"], f"{hw}: HEARTH_DATA_DIR is not the data dir")
    auto_names = {n for n in env if n.startswith("HEARTH_AUTOSCALE_")}
    c.ok(auto_names == set(AUTOSCALE_ENV), f"{hw}: autoscale env is {sorted(auto_names)}, want {sorted(AUTOSCALE_ENV)}")
    for name, key in AUTOSCALE_ENV.items():
        e = env.get(name) or {}
        if key is not None:
            want = auto[key]
            want = ("true" if want else "false") if isinstance(want, bool) else str(want)
            c.ok(e.get("value") == want, f"{hw}: {name}={e.get('value')!r}, want {want!r} (sandboxHost.autoscaling.{key})")
    c.ok((env.get("HEARTH_AUTOSCALE_BACKEND") or {}).get("value") == "kubernetes", f"{hw}: HEARTH_AUTOSCALE_BACKEND is not kubernetes")
    c.ok((env.get("HEARTH_AUTOSCALE_DEPLOYMENT") or {}).get("value") == host_name, f"{hw}: HEARTH_AUTOSCALE_DEPLOYMENT is not {host_name}")
    c.ok(((env.get("HEARTH_AUTOSCALE_NAMESPACE") or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace",
         f"{hw}: HEARTH_AUTOSCALE_NAMESPACE is not the downward API's metadata.namespace")
    c.ok((env.get("HEARTH_HOST_LEASE_TTL_SECONDS") or {}).get("value") == str(sh["leaseTtlSeconds"]), f"{hw}: HEARTH_HOST_LEASE_TTL_SECONDS is not sandboxHost.leaseTtlSeconds")

    args = ct.get("args") or []
    c.ok(args[:2] == ["host", "serve"], f"{hw}: args {args} do not start with host serve")
    c.ok(arg_after(args, "--listen") == "0.0.0.0:19190", f"{hw}: --listen is {arg_after(args, '--listen')}")
    adv = arg_after(args, "--advertise") or ""
    m = re.fullmatch(r"\$\((\w+)\):(\d+)", adv)
    c.ok(m and int(m.group(2)) == 19190, f"{hw}: --advertise {adv!r} is not $(VAR):19190")
    if m:
        fr = ((env.get(m.group(1)) or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        c.ok(fr in ("status.podIP", "status.hostIP"), f"{hw}: --advertise's {m.group(1)} is not the pod's/node's IP")

    # ---- control plane and the hosts' --control URL
    cw = f"{w} control Deployment"
    cspec = check_pod_spec(control, c, cw)
    c.ok(control["spec"].get("replicas") == values["control"]["replicas"], f"{cw}: replicas is not control.replicas")
    cct = cspec["containers"][0]
    c.ok(cct.get("image") == image, f"{cw}: image is not {image}")
    cargs = cct.get("args") or []
    c.ok(cargs[:1] == ["up"] and "--no-local-host" in cargs, f"{cw}: args {cargs} are not up … --no-local-host")
    listen = arg_after(cargs, "--listen") or ":0"
    cports = {p.get("name"): p.get("containerPort") for p in cct.get("ports") or []}
    c.ok(port_of(listen) in cports.values(), f"{cw}: --listen {listen} is no containerPort")
    c.ok("livenessProbe" in cct and "readinessProbe" in cct, f"{cw}: needs liveness and readiness probes")
    c.ok(((cct.get("readinessProbe") or {}).get("httpGet") or {}).get("path") != "/readyz",
         f"{cw}: readiness on /readyz deadlocks (it needs a ready host, which registers through this Service)")
    c.ok((cct.get("securityContext") or {}).get("privileged") is not True, f"{cw}: control plane must not be privileged")
    cenv = env_of(cct)
    db = (cenv.get("HEARTH_DATABASE_URL") or {}).get("valueFrom", {}).get("secretKeyRef")
    if c.ok(db, f"{cw}: HEARTH_DATABASE_URL is not from a Secret"):
        if values["database"]["url"]:
            s = find(objs, "Secret", lambda o: o["metadata"]["name"] == db["name"])
            c.ok(s and (s[0].get("stringData") or {}).get(db["key"]) == values["database"]["url"],
                 f"{cw}: the database Secret {db['name']} does not hold database.url under {db['key']}")
        else:
            c.ok(db == {"name": values["database"]["existingSecret"], "key": values["database"]["existingSecretKey"]},
                 f"{cw}: HEARTH_DATABASE_URL is not database.existingSecret/existingSecretKey")
    c.ok("HEARTH_DATABASE_URL" not in env, f"{hw}: hosts must not get the database URL")

    services = find(objs, "Service", lambda o: component(o) == "control")
    if c.ok(len(services) == 1, f"{w} expected one control Service"):
        svc = services[0]
        sel = svc["spec"].get("selector") or {}
        c.ok(sel and subset(sel, control_pod_labels), f"{w} control Service selects no control pod")
        c.ok(not subset(sel, host_pod_labels), f"{w} control Service would select host pods")
        url = arg_after(args, "--control") or ""
        um = re.fullmatch(r"http://([a-z0-9.-]+):(\d+)", url)
        if c.ok(um, f"{hw}: --control {url!r} is not http://host:port"):
            c.ok(um.group(1) in (svc["metadata"]["name"], f"{svc['metadata']['name']}.{NAMESPACE}.svc",
                                 f"{svc['metadata']['name']}.{NAMESPACE}.svc.cluster.local"),
                 f"{hw}: --control host {um.group(1)} is not the control Service")
            sports = svc["spec"].get("ports") or []
            match = [p for p in sports if p.get("port") == int(um.group(2))]
            c.ok(match, f"{hw}: --control port {um.group(2)} is not a port of Service {svc['metadata']['name']}")
            for p in match:
                tp = p.get("targetPort", p.get("port"))
                target = cports.get(tp) if isinstance(tp, str) else tp
                c.ok(target == port_of(listen), f"{w} Service port {p['port']} targets {tp}, not the control's --listen port")
        public = values["publicUrl"] or url
        c.ok((cenv.get("HEARTH_PUBLIC_URL") or {}).get("value") == public, f"{cw}: HEARTH_PUBLIC_URL is not {public}")

    # ---- shared: store, credentials, master key
    for dep, ctr, ew in ((host, ct, hw), (control, cct, cw)):
        e = env_of(ctr)
        c.ok((e.get("HEARTH_STORE_URL") or {}).get("value") == values["store"]["url"], f"{ew}: HEARTH_STORE_URL is not store.url")
        c.ok((e.get("HEARTH_LOG") or {}).get("value") == values["logLevel"], f"{ew}: HEARTH_LOG is not logLevel")
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            ref = ((e.get(k) or {}).get("valueFrom") or {}).get("secretKeyRef")
            if values["store"]["existingSecret"]:
                c.ok(ref == {"name": values["store"]["existingSecret"], "key": k}, f"{ew}: {k} is not from store.existingSecret")
            else:
                c.ok(k not in e, f"{ew}: {k} set without store.existingSecret")
        keyfile = (e.get("HEARTH_MASTER_KEY_FILE") or {}).get("value") or ""
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
    mk = find(objs, "Secret", lambda o: o["metadata"]["name"] == f"{fullname(values)}-master-key")
    if values["masterKey"]["existingSecret"]:
        c.ok(not mk, f"{w} a master key Secret is generated although masterKey.existingSecret is set")
    elif c.ok(len(mk) == 1, f"{w} no generated master key Secret"):
        raw = base64.b64decode((mk[0].get("data") or {}).get("master.key", ""))
        c.ok(len(raw) == 32, f"{w} generated master key is {len(raw)} bytes, hearth needs 32")
        c.ok((mk[0]["metadata"].get("annotations") or {}).get("helm.sh/resource-policy") == "keep",
             f"{w} master key Secret is not kept on uninstall")

    # ---- RBAC
    sa = spec.get("serviceAccountName")
    c.ok(find(objs, "ServiceAccount", lambda o: o["metadata"]["name"] == sa), f"{hw}: ServiceAccount {sa} is not rendered")
    roles = find(objs, "Role")
    if c.ok(len(roles) == 1, f"{w} expected one Role, got {len(roles)}"):
        role = roles[0]
        got = set()
        for rule in role.get("rules") or []:
            for g in rule.get("apiGroups") or []:
                for res in rule.get("resources") or []:
                    for verb in rule.get("verbs") or []:
                        for rn in rule.get("resourceNames") or [None]:
                            got.add((g, res, verb, rn))
        want = {("coordination.k8s.io", "leases", v, None) for v in ("create", "delete", "get", "list", "update", "watch")}
        want |= {("apps", r, v, host_name) for r in ("deployments", "deployments/scale") for v in ("get", "patch")}
        want |= {("", "pods", "patch", None)}
        c.ok(got == want, f"{w} Role grants {sorted(got - want, key=str)} extra, misses {sorted(want - got, key=str)}")
        bindings = find(objs, "RoleBinding")
        if c.ok(len(bindings) == 1, f"{w} expected one RoleBinding"):
            rb = bindings[0]
            c.ok(rb.get("roleRef") == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]},
                 f"{w} RoleBinding does not reference the Role")
            c.ok(rb.get("subjects") == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}],
                 f"{w} RoleBinding subjects {rb.get('subjects')} are not the host ServiceAccount {sa}")
    c.ok(not find(objs, "ClusterRole") and not find(objs, "ClusterRoleBinding"), f"{w} no cluster-wide RBAC expected")
    c.ok(cspec.get("serviceAccountName") != sa, f"{cw}: the control plane must not use the hosts' ServiceAccount")
    c.ok(cspec.get("automountServiceAccountToken") is False, f"{cw}: control plane should not mount an API token")

    # ---- PodDisruptionBudget
    pdbs = find(objs, "PodDisruptionBudget")
    if sh["pdb"]["enabled"]:
        if c.ok(len(pdbs) == 1, f"{w} pdb.enabled but no PodDisruptionBudget"):
            p = pdbs[0]
            c.ok(p["spec"].get("maxUnavailable") == sh["pdb"]["maxUnavailable"] == 1, f"{w} PDB maxUnavailable is not 1")
            c.ok(p["spec"]["selector"]["matchLabels"] == host["spec"]["selector"]["matchLabels"], f"{w} PDB does not select the host pods")
    else:
        c.ok(not pdbs, f"{w} PodDisruptionBudget rendered although sandboxHost.pdb.enabled is false")

    kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objs)
    return kinds


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
            }
        }
    },
    "pdb": {"sandboxHost": {"pdb": {"enabled": True}}},
    # Every other branch of the templates: inline database URL, existing
    # secrets, public URL, pull secrets, annotations, placement knobs.
    "other-branches": {
        "nameOverride": "sbx",
        "publicUrl": "https://sandboxes.example.com",
        "logLevel": "debug",
        "database": {"url": "postgres://hearth:pw@db:5432/hearth"},
        "masterKey": {"existingSecret": "my-master-key", "existingSecretKey": "key"},
        "store": {"existingSecret": "s3-creds"},
        "images": {"pullSecrets": [{"name": "regcred"}]},
        "control": {
            "nodeSelector": {"pool": "system"},
            "tolerations": [{"key": "system", "operator": "Exists"}],
            "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/c"}},
        },
        "sandboxHost": {
            "priorityClassName": "system-node-critical",
            "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/h"}},
        },
    },
}


def check_renders(chart, c):
    c.section("rendering (tiny renderer): " + ", ".join(SCENARIOS) + ", upgrade with an installed master key")
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

    # An upgrade must reuse the installed master key (lookup finds it).
    installed = base64.b64encode(b"k" * 32).decode()
    fixture = {("v1", "Secret", NAMESPACE, f"{RELEASE}-hearth-master-key"): {"data": {"master.key": installed}}}
    try:
        rendered, _, _ = chart.render(REQUIRED_VALUES, lookups=fixture)
        objs = [d for d in yaml.safe_load_all(rendered["secrets.yaml"]) if d]
        key = [o for o in objs if o["metadata"]["name"] == f"{RELEASE}-hearth-master-key"]
        c.ok(key and key[0]["data"]["master.key"] == installed, "[upgrade] the installed master key is not reused")
    except TemplateError as e:
        c.ok(False, f"[upgrade] render failed: {e}")

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
