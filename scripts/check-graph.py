#!/usr/bin/env python3
"""Dependency-graph checks for the workspace (stdlib only, Python 3.11+).

1. Crate graph: the workspace crates' normal `[dependencies]` (not dev/build)
   must respect CRATE_RULES below, directly or transitively through other
   workspace crates; and the PURE_CRATES (the role state machines, the pure
   checks and what they build on) must not reach an async runtime, network,
   store or database crate (BANNED_IN_PURE) through any normal dependency,
   external ones included.
2. File import cycles: inside each workspace crate, the source files under
   `src/` must not import each other in a cycle. Edges come from
   `crate::`/`super::`/`self::` paths (and paths through child modules or
   imported module names) in `use` items and in code, resolved to the file
   that defines the named item, following re-exports (`pub use`, globs
   included). A `pub use` re-export does not by itself make an edge from the
   file that holds it (a facade forwards names; it does not use them) unless
   that file's own code also uses the re-exported name. `mod x;` declarations
   are not edges. Every crate root (lib, each bin) is its own module tree, so
   a bin can only reach the library through the crate name, never in a cycle.

Exit status: 0 clean, 1 a rule is broken or a cycle exists, 2 the check
itself could not run (bad root, cargo failed, a rule names an unknown crate).

Usage: scripts/check-graph.py [--root PATH] [--skip-crate-graph]
"""

import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tomllib

# ---------------------------------------------------------------------------
# Crate graph rules: crate -> workspace crates it must not depend on, directly
# or transitively through workspace crates ("*" = any other workspace crate).
# Only normal dependencies count (kind null in `cargo metadata`).
CRATE_RULES = {
    "iota-dataplane": ["iota-control"],
    "iota-protocol": ["iota-model", "iota-cuda", "iota-dataplane", "iota-control"],
    "iota-core": ["*"],
    "iota-roles": ["iota-cuda", "iota-protocol", "iota-dataplane", "iota-control"],
    "iota-checks": ["iota-cuda", "iota-protocol", "iota-dataplane", "iota-control"],
    "iota-wire": ["iota-model", "iota-cuda", "iota-protocol", "iota-dataplane", "iota-control"],
    "iota-model": ["iota-protocol", "iota-dataplane", "iota-control", "iota-cuda"],
}

# Pure crates: no async runtime, network, store or database anywhere in their
# normal dependency tree (external crates included, transitively), so the
# role state machines and the checks are pure by construction, not by
# convention (issue 54). A crate matches a banned name exactly or, for a
# name ending in "*", by prefix.
PURE_CRATES = ["iota-core", "iota-wire", "iota-checks", "iota-roles"]
BANNED_IN_PURE = ["tokio", "tokio-*", "tonic", "tonic-*", "quinn", "quinn-*", "hyper", "hyper-*",
                  "h2", "mio", "socket2", "aws-*", "rusqlite", "libsqlite3-sys", "postgres",
                  "postgres-*", "reqwest", "rustls", "tokio-uring"]
# ---------------------------------------------------------------------------

MAX_LINES_PER_EDGE = 12


def banned_name(name):
    return any(name == b or (b.endswith("*") and name.startswith(b[:-1])) for b in BANNED_IN_PURE)


def check_pure_crates(root):
    """The PURE_CRATES rule over the resolved graph (external crates too)."""
    base = ["cargo", "metadata", "--format-version", "1", "--manifest-path", os.path.join(root, "Cargo.toml")]
    res = None
    # Offline first (no network needed once dependencies are fetched), then
    # online: a fresh clone has not fetched them yet.
    for cmd in (base + ["--offline"], base):
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except FileNotFoundError:
            raise CheckError("cargo not found on PATH (needed for the crate graph check)")
        if res.returncode == 0:
            break
    if res.returncode != 0:
        raise CheckError(f"`{' '.join(base)}` failed:\n{res.stderr.strip()}")
    meta = json.loads(res.stdout)
    names = {p["id"]: p["name"] for p in meta["packages"]}
    members = {names[i]: i for i in meta["workspace_members"]}
    unknown = [c for c in PURE_CRATES if c not in members]
    if unknown:
        raise CheckError(f"PURE_CRATES in {__file__} names crate(s) not in the workspace: {', '.join(unknown)}")
    normal = {}
    for node in meta["resolve"]["nodes"]:
        normal[node["id"]] = [d["pkg"] for d in node["deps"]
                              if any(k["kind"] is None for k in d.get("dep_kinds", []))]
    problems = []
    for crate in PURE_CRATES:
        start = members[crate]
        parent = {start: None}
        queue = collections.deque([start])
        while queue:
            c = queue.popleft()
            for d in normal.get(c, []):
                if d not in parent:
                    parent[d] = c
                    queue.append(d)
        for pkg in sorted(parent, key=lambda i: names[i]):
            if pkg != start and banned_name(names[pkg]):
                chain, c = [], pkg
                while c is not None:
                    chain.append(names[c])
                    c = parent[c]
                problems.append(f"{crate} must stay pure (no async runtime, network, store or database), "
                                f"but depends on {names[pkg]} via {' -> '.join(reversed(chain))}")
    return problems


class CheckError(Exception):
    """The check itself could not run (exit status 2)."""


# --------------------------------------------------------------------------- crate graph


def check_crate_graph(root):
    """Returns (problems, number of workspace crates)."""
    cmd = ["cargo", "metadata", "--format-version", "1", "--offline", "--no-deps",
           "--manifest-path", os.path.join(root, "Cargo.toml")]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise CheckError("cargo not found on PATH (needed for the crate graph check)")
    if res.returncode != 0:
        raise CheckError(f"`{' '.join(cmd)}` failed:\n{res.stderr.strip()}")
    meta = json.loads(res.stdout)
    members = set(meta["workspace_members"])
    pkgs = {p["name"]: p for p in meta["packages"] if p["id"] in members}

    graph = {}  # crate -> {workspace dep: "manifest path"}
    for name, p in pkgs.items():
        deps = {}
        for d in p["dependencies"]:
            if d["kind"] is None and d["name"] in pkgs and d["name"] != name:
                deps[d["name"]] = p["manifest_path"]
        graph[name] = deps

    for crate, banned in CRATE_RULES.items():
        unknown = [c for c in [crate, *banned] if c != "*" and c not in pkgs]
        if unknown:
            raise CheckError(f"CRATE_RULES in {__file__} names crate(s) not in the "
                             f"workspace: {', '.join(unknown)} (workspace: {', '.join(sorted(pkgs))})")

    problems = []
    for crate, banned in CRATE_RULES.items():
        # BFS over normal deps, remembering how each crate was reached.
        parent = {crate: None}
        queue = collections.deque([crate])
        while queue:
            c = queue.popleft()
            for d in sorted(graph[c]):
                if d not in parent:
                    parent[d] = c
                    queue.append(d)
        reached = [c for c in parent if c != crate]
        bad = sorted(reached if "*" in banned else [c for c in reached if c in banned])
        for b in bad:
            chain, c = [], b
            while c is not None:
                chain.append(c)
                c = parent[c]
            chain.reverse()
            what = "any other workspace crate" if "*" in banned else b
            via = "directly" if len(chain) == 2 else "via " + " -> ".join(chain)
            problems.append(f"{crate} must not depend on {what}, but depends on {b} {via} "
                            f"(see [dependencies] in {os.path.relpath(pkgs[chain[-2]]['manifest_path'], root)})")
    return problems, len(pkgs)


# --------------------------------------------------------------------------- lexer

KEYWORDS = set("""as async await break const continue crate dyn else enum extern false fn for
if impl in let loop match mod move mut pub ref return self Self static struct super trait true
type unsafe use where while abstract become box do final macro override priv typeof unsized
virtual yield try union macro_rules""".split())

_STR_START = re.compile(r'(?:[bc]?r(#*)"|[bc]?"|b\')')
_IDENT = re.compile(r"[^\W\d]\w*")
_NUMBER = re.compile(r"\d[\w]*(?:\.\d[\w]*)?")


class Tok:
    __slots__ = ("kind", "val", "line")

    def __init__(self, kind, val, line):
        self.kind, self.val, self.line = kind, val, line

    def __repr__(self):
        return f"{self.kind}:{self.val}@{self.line}"


def lex(src):
    """Tokens of Rust source, with comments dropped and literals opaque.

    kinds: id (identifier or keyword), rid (raw identifier r#x), str (any
    string/char literal, value = contents), lt (lifetime), num, p (punct;
    `::` is one token)."""
    toks, i, n, line = [], 0, len(src), 1
    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if src[i] == "\n":
                        line += 1
                    i += 1
        elif (c == '"' or (c in "bcr" and not (i > 0 and (src[i - 1].isalnum() or src[i - 1] == "_")))) \
                and (m := _STR_START.match(src, i)):
            start_line = line
            head = m.group(0)
            if head.endswith("'"):  # b'x'
                j = i + 2
                if j < n and src[j] == "\\":
                    j += 2
                while j < n and src[j] != "'":
                    j += 1
                toks.append(Tok("str", src[i + 2:j], start_line))
                i = j + 1
            elif "r" in head:  # raw string
                close = '"' + m.group(1)
                j = src.find(close, m.end())
                j = n if j < 0 else j
                body = src[m.end():j]
                line += body.count("\n")
                toks.append(Tok("str", body, start_line))
                i = j + len(close)
            else:
                j = m.end()
                while j < n and src[j] != '"':
                    if src[j] == "\\":
                        j += 1
                    j += 1
                body = src[m.end():j]
                line += body.count("\n")
                toks.append(Tok("str", body, start_line))
                i = j + 1
        elif c == "'":
            if i + 1 < n and src[i + 1] == "\\":  # '\n', '\'', '\u{..}'
                j = i + 3
                while j < n and src[j] != "'":
                    j += 1
                toks.append(Tok("str", src[i + 1:j], line))
                i = j + 1
            elif i + 2 < n and src[i + 2] == "'":  # 'x'
                toks.append(Tok("str", src[i + 1], line))
                i += 3
            else:  # lifetime or label
                m = _IDENT.match(src, i + 1)
                if m:
                    toks.append(Tok("lt", m.group(0), line))
                    i = m.end()
                else:
                    toks.append(Tok("p", "'", line))
                    i += 1
        elif c == "r" and src.startswith("r#", i) and (m := _IDENT.match(src, i + 2)):
            toks.append(Tok("rid", m.group(0), line))
            i = m.end()
        elif c == "$" and src.startswith("$crate", i) and not (
                i + 6 < n and (src[i + 6].isalnum() or src[i + 6] == "_")):
            toks.append(Tok("id", "$crate", line))
            i += 6
        elif (m := _IDENT.match(src, i)):
            toks.append(Tok("id", m.group(0), line))
            i = m.end()
        elif c.isdigit():
            m = _NUMBER.match(src, i)
            toks.append(Tok("num", m.group(0), line))
            i = m.end()
        elif src.startswith("::", i):
            toks.append(Tok("p", "::", line))
            i += 2
        else:
            toks.append(Tok("p", c, line))
            i += 1
    return toks


def is_name(t):
    return t.kind == "rid" or (t.kind == "id" and t.val not in KEYWORDS)


# --------------------------------------------------------------------------- per-file parse


class UseLeaf:
    """One leaf of a `use` tree: `segs` as written (relative to `scope`)."""
    __slots__ = ("segs", "glob", "alias", "is_pub", "scope", "line", "file")

    def __init__(self, segs, glob_, alias, is_pub, scope, line, file):
        self.segs, self.glob, self.alias = segs, glob_, alias
        self.is_pub, self.scope, self.line, self.file = is_pub, scope, line, file

    def local_name(self):
        return None if self.glob else (self.alias or self.segs[-1])

    def text(self):
        return "::".join(self.segs) + ("::*" if self.glob else "") + \
            (f" as {self.alias}" if self.alias else "")


class CodePath:
    __slots__ = ("segs", "scope", "line")

    def __init__(self, segs, scope, line):
        self.segs, self.scope, self.line = segs, scope, line


class FileInfo:
    def __init__(self, path, rel, scope):
        self.path, self.rel, self.scope = path, rel, tuple(scope)
        with open(path, encoding="utf-8") as f:
            self.src = f.read()
        self.lines = self.src.splitlines()
        self.toks = lex(self.src)
        self.defs = collections.defaultdict(set)      # scope -> item names
        self.exported_macros = set()                   # #[macro_export] names
        self.mod_decls = []                            # (scope, name, path attr or None, line)
        self.inline_mods = []                          # scope of each inline module
        self.uses = []                                 # UseLeaf
        self.code_paths = []                           # CodePath
        self.code_idents = set()                       # names used in code (outside `use`)
        self.includes = []                             # include!("x") arguments
        self._parse()

    # -- helpers
    def _item_prefix(self, i):
        """Tokens of the attributes/visibility before the item keyword at i."""
        j = i - 1
        while j >= 0 and not (self.toks[j].kind == "p" and self.toks[j].val in ";{}"):
            j -= 1
        # `}` can close an attribute argument? no: attributes use [] / (); fine.
        return self.toks[j + 1:i]

    def _parse(self):
        toks, n = self.toks, len(self.toks)
        depth = 0
        stack = [(self.scope, 0)]   # (module path, brace depth of its body)
        in_use = [False] * n
        i = 0
        while i < n:
            t = toks[i]
            scope, body_depth = stack[-1]
            if t.kind == "p":
                if t.val == "{":
                    depth += 1
                elif t.val == "}":
                    if len(stack) > 1 and depth == body_depth:
                        stack.pop()
                    depth -= 1
                i += 1
                continue
            if t.kind != "id":
                i += 1
                continue
            at_mod_level = depth == body_depth
            if t.val == "use" and not (i + 1 < n and toks[i + 1].val == "<"):  # not `impl T + use<'a>`
                j = self._parse_use(i, scope)
                for k in range(i, min(j, n)):
                    in_use[k] = True
                i = j
                continue
            if at_mod_level and t.val == "mod" and i + 1 < n and is_name(toks[i + 1]):
                name = toks[i + 1].val
                self.defs[scope].add(name)
                if i + 2 < n and toks[i + 2].val == "{":
                    depth += 1
                    stack.append((scope + (name,), depth))
                    self.inline_mods.append(scope + (name,))
                    i += 3
                    continue
                path_attr = None
                pre = self._item_prefix(i)
                for k in range(len(pre) - 2):
                    if pre[k].val == "path" and pre[k + 1].val == "=" and pre[k + 2].kind == "str":
                        path_attr = pre[k + 2].val
                self.mod_decls.append((scope, name, path_attr, t.line))
                i += 2
                continue
            if at_mod_level and t.val in ("fn", "struct", "enum", "trait", "type", "const",
                                          "static", "union") and i + 1 < n:
                k = i + 1
                if t.val == "static" and toks[k].val == "mut":
                    k += 1
                if k < n and is_name(toks[k]) and toks[k].val != "_":
                    if t.val != "union" or (k + 1 < n and toks[k + 1].val in ("{", "<", "where")):
                        self.defs[scope].add(toks[k].val)
            if t.val == "include" and i + 3 < n and toks[i + 1].val == "!" and toks[i + 3].kind == "str":
                self.includes.append(toks[i + 3].val)
            if at_mod_level and t.val == "macro_rules" and i + 2 < n and toks[i + 1].val == "!" \
                    and is_name(toks[i + 2]):
                name = toks[i + 2].val
                self.defs[scope].add(name)
                if any(x.val == "macro_export" for x in self._item_prefix(i)):
                    self.exported_macros.add(name)
            i += 1

        # Second pass: paths and identifiers in code (outside `use` items).
        depth, stack = 0, [(self.scope, 0)]
        i = 0
        while i < n:
            t = toks[i]
            scope, body_depth = stack[-1]
            if t.kind == "p":
                if t.val == "{":
                    depth += 1
                elif t.val == "}":
                    if len(stack) > 1 and depth == body_depth:
                        stack.pop()
                    depth -= 1
                i += 1
                continue
            if t.kind == "id" and t.val == "mod" and i + 2 < n and is_name(toks[i + 1]) \
                    and toks[i + 2].val == "{" and depth == body_depth:
                depth += 1
                stack.append((scope + (toks[i + 1].val,), depth))
                i += 3
                continue
            if in_use[i] or t.kind not in ("id", "rid"):
                i += 1
                continue
            prev = toks[i - 1] if i > 0 else None
            after_sep = prev is not None and prev.kind == "p" and prev.val in ("::", ".")
            if is_name(t) and not after_sep:
                nxt = toks[i + 1] if i + 1 < n else None
                decl = prev is not None and prev.kind == "id" and prev.val in (
                    "fn", "struct", "enum", "trait", "type", "const", "static", "union", "mod")
                field = nxt is not None and nxt.val == ":" and not (
                    i + 2 < n and toks[i + 2].val == ":")
                if not decl and not field:
                    self.code_idents.add(t.val)
            starts_path = (t.val in ("crate", "$crate", "super", "self") or is_name(t)) \
                and i + 1 < n and toks[i + 1].val == "::" and not after_sep
            if starts_path and t.val == "crate" and i >= 3 and toks[i - 1].val == "in" \
                    and toks[i - 2].val == "(" and toks[i - 3].val == "pub":
                starts_path = False  # pub(in crate::x) is a visibility, not a use
            if starts_path and t.val in ("super", "self") and i >= 3 and toks[i - 1].val == "in" \
                    and toks[i - 2].val == "(" and toks[i - 3].val == "pub":
                starts_path = False
            if starts_path:
                segs, j = [t.val], i + 1
                while j + 1 < n and toks[j].val == "::" and toks[j + 1].kind in ("id", "rid") \
                        and (toks[j + 1].val in ("super", "self") or is_name(toks[j + 1])):
                    segs.append(toks[j + 1].val)
                    j += 2
                if len(segs) > 1:
                    self.code_paths.append(CodePath(segs, scope, t.line))
                    # A path's later segments are not free names, but its first
                    # is (e.g. `Output::new` uses the imported `Output`).
                    i = j
                    continue
            i += 1

    def _parse_use(self, i, scope):
        """Parses the use item starting at toks[i] (`use`); returns index after `;`."""
        toks, n = self.toks, len(self.toks)
        is_pub = i > 0 and toks[i - 1].val == "pub"
        if i > 0 and toks[i - 1].val == ")":  # pub(crate) / pub(super) / pub(in path)
            k, d = i - 1, 0
            while k >= 0:
                d += {")": 1, "(": -1}.get(toks[k].val, 0)
                if d == 0:
                    break
                k -= 1
            is_pub = k > 0 and toks[k - 1].val == "pub"
        line0 = toks[i].line
        leaves = []

        def parse_tree(j, prefix):
            # returns index after the tree
            segs = list(prefix)
            if j < n and toks[j].val == "::":  # leading `::` = extern path
                segs.append("::")
                j += 1
            while j < n:
                t = toks[j]
                if t.val == "{":
                    j += 1
                    while j < n and toks[j].val != "}":
                        j = parse_tree(j, segs)
                        if j < n and toks[j].val == ",":
                            j += 1
                    return j + 1
                if t.val == "*":
                    leaves.append((segs, True, None, t.line))
                    return j + 1
                if t.kind in ("id", "rid"):
                    if t.val == "self" and segs and segs != ["::"]:
                        # `a::{self}` names module `a`
                        alias = None
                        j += 1
                        if j + 1 < n and toks[j].val == "as":
                            alias = toks[j + 1].val
                            j += 2
                        leaves.append((segs, False, alias, t.line))
                        return j
                    segs = segs + [t.val]
                    j += 1
                    if j < n and toks[j].val == "::":
                        j += 1
                        continue
                    alias = None
                    if j + 1 < n and toks[j].val == "as":
                        alias = toks[j + 1].val
                        j += 2
                    leaves.append((segs, False, alias, t.line))
                    return j
                return j  # unexpected token; give up on this tree
            return j

        j = parse_tree(i + 1, [])
        while j < n and toks[j].val != ";":
            j += 1
        for segs, g, alias, line in leaves:
            if segs and segs[0] != "::":
                self.uses.append(UseLeaf(segs, g, alias, is_pub, scope, line or line0, self))
        return j + 1


# --------------------------------------------------------------------------- module trees


class Tree:
    """One crate root (lib or a bin) and the modules reachable from it."""

    def __init__(self, crate, label, root_file, root_dir):
        self.crate, self.label, self.root_file = crate, label, root_file
        self.modules = {}   # module path tuple -> FileInfo holding it
        self.files = []     # FileInfo
        self.included = set()  # files pulled in by include!() (their text is not scanned)
        self.warnings = []
        self._load(root_file, ("crate",), root_dir)

    def _load(self, path, scope, root_dir):
        rel = os.path.relpath(path, root_dir)
        fi = FileInfo(path, rel, scope)
        self.files.append(fi)
        self.modules[scope] = fi
        for s in fi.inline_mods:
            self.modules[s] = fi
        for inc in fi.includes:
            self.included.add(os.path.normpath(os.path.join(os.path.dirname(path), inc)))
        base = os.path.basename(path)
        mod_rs = scope == ("crate",) or base == "mod.rs"
        own_dir = os.path.dirname(path) if mod_rs else os.path.splitext(path)[0]
        for mscope, name, path_attr, line in fi.mod_decls:
            inline = mscope[len(scope):]
            if path_attr is not None:
                d = os.path.dirname(path) if not inline else os.path.join(own_dir, *inline)
                cands = [os.path.join(d, path_attr)]
            else:
                d = os.path.join(own_dir, *inline)
                cands = [os.path.join(d, name + ".rs"), os.path.join(d, name, "mod.rs")]
            found = [c for c in cands if os.path.isfile(c)]
            if not found:
                self.warnings.append(f"{rel}:{line}: `mod {name};` has no file (looked for "
                                     f"{', '.join(os.path.relpath(c, root_dir) for c in cands)})")
                continue
            child = os.path.normpath(found[0])
            if any(f.path == child for f in self.files):
                continue
            self._load(child, mscope + (name,), root_dir)

    # -- name resolution
    def absolute(self, segs, scope, _seen=None):
        """Absolute module path segments for a path written in `scope`, or None
        when it leaves the crate (extern crate, std, prelude...)."""
        first = segs[0]
        if first in ("crate", "$crate"):
            return ["crate"] + list(segs[1:])
        if first in ("super", "self"):
            cur = list(scope)
            k = 0
            while k < len(segs) and segs[k] in ("super", "self"):
                if segs[k] == "super":
                    if len(cur) == 1:
                        return None
                    cur.pop()
                k += 1
            return cur + list(segs[k:])
        if tuple(scope) + (first,) in self.modules:          # child module (2018 paths)
            return list(scope) + list(segs)
        # The aliases already being followed travel along, so uses that
        # refer to each other (`use std::io; use io::ErrorKind::*;` in one
        # scope) end instead of recursing for ever.
        target = self.scope_alias(scope, first, _seen)
        if target is not None:
            return list(target) + list(segs[1:])
        return None

    def scope_alias(self, scope, name, _seen=None):
        """Module that `name` denotes in `scope` through a `use`, if any."""
        fi = self.modules.get(tuple(scope))
        if fi is None:
            return None
        _seen = _seen if _seen is not None else set()
        if (tuple(scope), name) in _seen:
            return None
        _seen.add((tuple(scope), name))
        for u in fi.uses:
            if u.scope == tuple(scope) and u.local_name() == name and u.segs[0] != name:
                r = self.resolve(u.segs, u.scope, _seen=_seen)
                if r and r[0] == "module":
                    return r[1]
        for u in fi.uses:  # a glob import brings the globbed module's child modules
            if u.scope == tuple(scope) and u.glob and u.segs[0] != name:
                r = self.resolve(u.segs, u.scope, _seen=_seen)
                if r and r[0] == "module" and r[1] + (name,) in self.modules:
                    return r[1] + (name,)
        return None

    def resolve(self, segs, scope, _seen=None):
        """('module', path) | ('file', FileInfo, via) | None (outside the crate)."""
        _seen = _seen if _seen is not None else set()
        a = self.absolute(segs, scope, _seen)
        if a is None:
            return None
        return self.resolve_abs(a, _seen)

    def resolve_abs(self, a, seen):
        cur = ("crate",)
        via = []
        k = 1
        while k < len(a):
            seg = a[k]
            if cur + (seg,) in self.modules:
                cur = cur + (seg,)
                k += 1
                continue
            b = self.lookup(cur, seg, seen, via)
            if b is None:           # not found: item made by a macro, a variant...
                return ("file", self.modules[cur], via)
            if b == "extern":
                return None
            if b[0] == "module":
                cur = b[1]
                k += 1
                continue
            return ("file", b[1], via)
        return ("module", cur)

    def lookup(self, mod, name, seen, via):
        """Where item `name` of module `mod` is defined: ('file', FileInfo),
        ('module', path), "extern", or None when unknown."""
        key = (mod, name)
        if key in seen:
            return None
        seen = seen | {key}
        fi = self.modules[mod]
        if name in fi.defs.get(mod, ()):
            return ("file", fi)
        if mod == ("crate",):
            for f in self.files:
                if name in f.exported_macros:
                    return ("file", f)
        mine = [u for u in fi.uses if u.scope == mod]
        for u in sorted(mine, key=lambda u: not u.is_pub):
            if u.local_name() == name:
                a = self.absolute(u.segs, u.scope)
                if a is None:
                    return "extern"
                r = self.resolve_abs(a, seen)
                via.append(f"{fi.rel}:{u.line}")
                if r is None:
                    return "extern"
                return r if r[0] == "module" else ("file", r[1])
        fallback = None
        for u in sorted((u for u in mine if u.glob), key=lambda u: not u.is_pub):
            a = self.absolute(u.segs, u.scope)
            if a is None:
                continue
            r = self.resolve_abs(a, seen)
            if r is None or r[0] != "module":
                continue
            b = self.lookup(r[1], name, seen, via)
            if b is not None and b != "extern":
                via.append(f"{fi.rel}:{u.line}")
                return b
            if u.is_pub and fallback is None:
                fallback = r[1]
        if fallback is not None:
            return ("file", self.modules[fallback])
        return None


# --------------------------------------------------------------------------- edges and cycles


def file_edges(tree):
    """{(from rel, to rel): [(line, reason)]} for one module tree."""
    edges = collections.defaultdict(list)

    def add(fi, target, line, reason):
        if target is not fi:
            edges[(fi.rel, target.rel)].append((line, reason))

    for fi in tree.files:
        for u in fi.uses:
            r = tree.resolve(u.segs, u.scope)
            if r is None:
                continue
            if u.glob:
                if r[0] != "module":
                    continue
                target = tree.modules[r[1]]
                if u.is_pub:
                    # A glob re-export is a use only if this file's code names
                    # something the globbed module defines.
                    used = fi.code_idents & set(target.defs.get(r[1], ()))
                    if not used:
                        continue
                    add(fi, target, u.line, f"pub use {u.text()} (and uses {', '.join(sorted(used))} here)")
                else:
                    add(fi, target, u.line, f"use {u.text()}")
                continue
            name = u.local_name()
            if u.is_pub and name not in fi.code_idents:
                continue  # a re-export only: a facade, not a use
            if r[0] == "module":
                # `use super::merge;` - the code paths through `merge::` make the
                # edges; the import alone only if the name is never used.
                used_as_path = any(cp.segs[0] == name and cp.scope == u.scope for cp in fi.code_paths)
                if used_as_path:
                    continue
                target = tree.modules[r[1]]
            else:
                target = r[1]
            kw = "pub use" if u.is_pub else "use"
            extra = f" (and uses {name} here)" if u.is_pub else ""
            add(fi, target, u.line, f"{kw} {u.text()}{extra}")
        for cp in fi.code_paths:
            r = tree.resolve(cp.segs, cp.scope)
            if r is None:
                continue
            target = tree.modules[r[1]] if r[0] == "module" else r[1]
            add(fi, target, cp.line, "::".join(cp.segs))
    return edges


def sccs(nodes, succ):
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def shortest_cycle(start, comp, succ):
    comp = set(comp)
    prev, queue = {start: None}, collections.deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(succ.get(v, ())):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w in comp and w not in prev:
                prev[w] = v
                queue.append(w)
    return [start]


def workspace_members(root):
    manifest = os.path.join(root, "Cargo.toml")
    if not os.path.isfile(manifest):
        raise CheckError(f"no Cargo.toml at {root}")
    with open(manifest, "rb") as f:
        ws = tomllib.load(f).get("workspace")
    if ws is None:
        raise CheckError(f"{manifest} has no [workspace]")
    excluded = {os.path.normpath(os.path.join(root, e)) for e in ws.get("exclude", [])}
    dirs = []
    for m in ws.get("members", []):
        for d in sorted(glob.glob(os.path.join(root, m))):
            d = os.path.normpath(d)
            if d not in excluded and os.path.isfile(os.path.join(d, "Cargo.toml")) and d not in dirs:
                dirs.append(d)
    return dirs


def crate_roots(crate_dir):
    """[(label, root file)]: the lib target and each bin target."""
    with open(os.path.join(crate_dir, "Cargo.toml"), "rb") as f:
        man = tomllib.load(f)
    roots = []
    lib = man.get("lib", {}).get("path", "src/lib.rs")
    if os.path.isfile(os.path.join(crate_dir, lib)):
        roots.append(("lib", os.path.normpath(os.path.join(crate_dir, lib))))
    bins = []
    for b in man.get("bin", []):
        if "path" in b:
            bins.append(b["path"])
        elif "name" in b:
            bins += [f"src/bin/{b['name']}.rs", f"src/bin/{b['name']}/main.rs"]
    if man.get("package", {}).get("autobins", True) is not False:
        bins.append("src/main.rs")
        bins += [os.path.relpath(p, crate_dir) for p in sorted(glob.glob(os.path.join(crate_dir, "src/bin/*.rs")))]
        bins += [os.path.relpath(p, crate_dir) for p in sorted(glob.glob(os.path.join(crate_dir, "src/bin/*/main.rs")))]
    for b in bins:
        p = os.path.normpath(os.path.join(crate_dir, b))
        if os.path.isfile(p) and all(p != r for _, r in roots):
            roots.append(("bin " + os.path.relpath(p, os.path.join(crate_dir, "src")), p))
    name = man.get("package", {}).get("name", os.path.basename(crate_dir))
    return name, roots


def check_file_cycles(root, print_edges=False):
    """Returns (report lines, number of crates, number of files, warnings)."""
    report, warnings = [], []
    n_crates = n_files = 0
    for crate_dir in workspace_members(root):
        name, roots = crate_roots(crate_dir)
        n_crates += 1
        seen_files = set()
        for label, root_file in roots:
            tree = Tree(name, label, root_file, root)
            warnings += tree.warnings
            seen_files.update(f.path for f in tree.files)
            seen_files.update(tree.included)
            edges = file_edges(tree)
            if print_edges:
                for (a, b), why in sorted(edges.items()):
                    lines = ", ".join(str(ln) for ln in sorted({ln for ln, _ in why}))
                    print(f"edge [{name} {label}] {a} -> {b}  (lines {lines})")
            succ = collections.defaultdict(set)
            for (a, b) in edges:
                succ[a].add(b)
            nodes = [f.rel for f in tree.files]
            for comp in sccs(nodes, succ):
                if len(comp) < 2:
                    continue
                comp = sorted(comp)
                cyc = shortest_cycle(comp[0], comp, succ)
                report.append(f"import cycle in {name} ({label}) among {len(comp)} files: "
                              + ", ".join(comp))
                report.append("  e.g. " + " -> ".join(cyc))
                for (a, b) in sorted(edges):
                    if a in comp and b in comp:
                        by_line = collections.defaultdict(list)
                        for line, reason in edges[(a, b)]:
                            if reason not in by_line[line]:
                                by_line[line].append(reason)
                        lines = sorted(by_line)
                        report.append(f"  {a} -> {b}:")
                        fi = next(f for f in tree.files if f.rel == a)
                        for line in lines[:MAX_LINES_PER_EDGE]:
                            src = fi.lines[line - 1].strip() if 0 < line <= len(fi.lines) else ""
                            report.append(f"    {a}:{line}: {src}    [{'; '.join(by_line[line])}]")
                        if len(lines) > MAX_LINES_PER_EDGE:
                            report.append(f"    ... and {len(lines) - MAX_LINES_PER_EDGE} more")
        src_dir = os.path.join(crate_dir, "src")
        all_rs = {os.path.normpath(p) for p in glob.glob(os.path.join(src_dir, "**", "*.rs"), recursive=True)}
        n_files += len(all_rs)
        for p in sorted(all_rs - seen_files):
            warnings.append(f"{os.path.relpath(p, root)}: not reached from any crate root by `mod`; not checked")
    return report, n_crates, n_files, warnings


def main():
    default_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=default_root, help="workspace root (default: %(default)s)")
    ap.add_argument("--skip-crate-graph", action="store_true",
                    help="only check file import cycles (no cargo needed)")
    ap.add_argument("--print-edges", action="store_true",
                    help="also print every file edge found (to debug the checker)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    failed = False
    try:
        if not args.skip_crate_graph:
            problems, n = check_crate_graph(root)
            problems += check_pure_crates(root)
            if problems:
                failed = True
                print("crate graph rule broken (CRATE_RULES in scripts/check-graph.py):", file=sys.stderr)
                for p in problems:
                    print("  " + p, file=sys.stderr)
            else:
                print(f"crate graph OK ({n} crates)", end="; ")
        report, n_crates, n_files, warnings = check_file_cycles(root, args.print_edges)
    except CheckError as e:
        print(f"check-graph: {e}", file=sys.stderr)
        return 2
    if report:
        print(f"{sum(1 for r in report if r.startswith('import cycle'))} file import cycle(s) "
              f"in {n_crates} crates ({n_files} files)")
    else:
        print(f"no file import cycles in {n_crates} crates ({n_files} files)")
    sys.stdout.flush()
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if report:
        failed = True
        print("file import cycles found (break them, e.g. by moving the items both sides "
              "need into a module of their own):", file=sys.stderr)
        for line in report:
            print(line, file=sys.stderr)
    return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main())
