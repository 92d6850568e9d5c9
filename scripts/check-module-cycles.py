#!/usr/bin/env python3
"""Fails when files of one crate import each other in a loop.

Every crate target of the workspace (lib, bins, tests, benches, examples) is
read from its root file along its `mod` declarations. A file depends on
another when its code names a module defined there: `use crate::a::b::C`,
`use super::super::x`, `use self::x::{y, z}`, a path such as `crate::a::f()`
or `child::f()` in an expression, or a `pub use` re-export (the file that
re-exports depends on the file it re-exports from). A parent `mod.rs` that
only declares its children (`mod x;`) does not depend on them; one that
imports from them does. Code under `#[cfg(test)]` (test modules, test
helpers) may import anything and is not read. Comments and string literals
are not read either, so intra-doc links are not imports.

Usage: check-module-cycles.py [--verbose] [--skip DIR]... [ROOT]
(--verbose: every edge inside each loop's files; --skip: a loop all of
whose files lie under DIR, relative to ROOT, is listed but does not fail,
for code being restructured elsewhere; ROOT: the workspace, by default the
repository this script is in). Exit status 1 and one line per loop, each
edge with the file and line that makes it, when there is a loop; 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from collections import defaultdict, deque
from dataclasses import dataclass, field

# ---------------------------------------------------------------- lexing ----

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<line_comment>//[^\n]*)
  | (?P<block_comment>/\*)
  | (?P<raw_string>b?r\#*")
  | (?P<string>b?")
  | (?P<char>b?'(?:[^'\\\n]|\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]{1,6}\}|.))')
  | (?P<lifetime>'[A-Za-z_][A-Za-z0-9_]*)
  | (?P<ident>r\#[A-Za-z_][A-Za-z0-9_]*|[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>[0-9][0-9A-Za-z_.]*)
  | (?P<path_sep>::)
  | (?P<punct>.)
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass
class Token:
    text: str
    line: int


def tokenize(source: str) -> list[Token]:
    """Identifiers, `::`, single punctuation characters and (whole) plain
    string literals, with their line; comments, raw strings, characters,
    numbers and lifetimes are dropped."""
    tokens: list[Token] = []
    pos, line, end = 0, 1, len(source)
    while pos < end:
        m = _TOKEN.match(source, pos)
        assert m is not None  # `punct` matches any character
        kind, text = m.lastgroup, m.group()
        if kind == "block_comment":
            depth, i = 1, m.end()
            while i < end and depth:
                if source.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif source.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            text = source[pos:i]
        elif kind == "raw_string":
            hashes = text.count("#")
            close = source.find('"' + "#" * hashes, m.end())
            stop = end if close < 0 else close + 1 + hashes
            text = source[pos:stop]
        elif kind == "string":
            i = m.end()
            while i < end and source[i] != '"':
                i += 2 if source[i] == "\\" else 1
            text = source[pos : i + 1]
            # Kept whole, as one token, for `#[path = "…"]`.
            tokens.append(Token(text, line))
        elif kind in ("ident", "path_sep", "punct"):
            tokens.append(Token(text[2:] if text.startswith("r#") else text, line))
        line += text.count("\n")
        pos += len(text)
    return tokens


# --------------------------------------------------------------- parsing ----

ITEM_KEYWORDS = {
    "fn", "mod", "use", "impl", "struct", "enum", "union", "trait", "const",
    "static", "type", "macro_rules", "extern",
}
# Items that end at their first `;` rather than at their first `{ }` block.
SEMICOLON_ITEMS = {"use", "const", "static", "type", "extern"}
QUALIFIERS = {"pub", "unsafe", "async", "default", "crate", "in", "self", "super"}
OPEN, CLOSE = "([{", ")]}"


@dataclass
class UseTree:
    """One name a `use` brings in: its path, the name it binds (None for a
    glob), and where it is written."""

    path: list[str]
    binding: str | None
    line: int


@dataclass
class Module:
    path: tuple[str, ...]
    file: str
    parent: "Module | None"
    children: dict[str, "Module"] = field(default_factory=dict)
    uses: list[UseTree] = field(default_factory=list)
    # Paths written in code: (segments, line).
    paths: list[tuple[list[str], int]] = field(default_factory=list)
    # Names bound by `use` to modules, resolved after parsing.
    aliases: dict[str, "Module"] = field(default_factory=dict)
    globs: list["Module"] = field(default_factory=list)
    # Declared under #[cfg(test)] (or inside such a module): not read.
    test_only: bool = False


def _is_test_cfg(attr: list[str]) -> bool:
    """`#[cfg(test)]` or `#[cfg(all(test, …))]`: compiled for tests only."""
    text = " ".join(attr)
    return bool(re.match(r"^cfg \( (?:all \( )?test\b", text))


class Parser:
    """Reads one file's tokens into the module tree rooted at `module`."""

    def __init__(self, tokens: list[Token], raw_source: str):
        self.tokens = tokens
        self.source = raw_source
        self.pos = 0

    def peek(self, offset: int = 0) -> str | None:
        i = self.pos + offset
        return self.tokens[i].text if i < len(self.tokens) else None

    def skip_group(self) -> None:
        """Skips a bracketed group starting at the current opening token."""
        depth = 0
        while self.pos < len(self.tokens):
            t = self.tokens[self.pos].text
            self.pos += 1
            if t in OPEN:
                depth += 1
            elif t in CLOSE:
                depth -= 1
                if depth == 0:
                    return

    def skip_item(self) -> None:
        """Skips the item, statement, field or arm a test-only attribute is
        on: up to its `;`, its first `{ }` block or its `,`."""
        i = self.pos
        while i < len(self.tokens) and self.tokens[i].text in QUALIFIERS | {"(", ")"}:
            i += 1
        keyword = self.tokens[i].text if i < len(self.tokens) else None
        if keyword == "extern" and i + 1 < len(self.tokens) and self.tokens[i + 1].text == "crate":
            keyword = "use"
        depth = 0
        while self.pos < len(self.tokens):
            t = self.tokens[self.pos].text
            if t in OPEN:
                if t == "{" and depth == 0 and keyword not in SEMICOLON_ITEMS:
                    self.skip_group()
                    return
                depth += 1
            elif t in CLOSE:
                if depth == 0:
                    return  # the end of the enclosing block
                depth -= 1
            elif depth == 0 and (t == ";" or (t == "," and keyword not in ITEM_KEYWORDS)):
                self.pos += 1
                return
            self.pos += 1

    def attribute(self) -> list[str]:
        """Reads `#[…]` or `#![…]` at the current `#`; returns its inner tokens."""
        self.pos += 1
        if self.peek() == "!":
            self.pos += 1
        start = self.pos
        self.skip_group()
        return [t.text for t in self.tokens[start + 1 : self.pos - 1]]

    def use_tree(self, prefix: list[str], out: list[UseTree], line: int) -> None:
        """Reads a use tree (after `use`, or inside braces) up to `,` `;` `}`."""
        path = list(prefix)
        if self.peek() == "::":  # `use ::krate::…`: an external crate
            path.append("::")
            self.pos += 1
        while True:
            t = self.peek()
            if t is None:
                return
            if t == "{":
                self.pos += 1
                while self.peek() not in (None, "}"):
                    self.use_tree(path, out, self.tokens[self.pos].line)
                    if self.peek() == ",":
                        self.pos += 1
                self.pos += 1
                return
            if t == "*":
                self.pos += 1
                out.append(UseTree(path, None, line))
                return
            if re.match(r"^[A-Za-z_]", t):
                path.append(t)
                self.pos += 1
                if self.peek() == "::":
                    self.pos += 1
                    continue
                binding = path[-1]
                if self.peek() == "as":
                    self.pos += 1
                    binding = self.peek() or binding
                    self.pos += 1
                if binding == "self":  # `a::{self}` binds `a`
                    path = path[:-1]
                    binding = path[-1] if path else None
                if binding and binding != "_":
                    out.append(UseTree(path, binding, line))
                elif binding == "_":
                    out.append(UseTree(path, "_", line))
                return
            return

    def module_body(self, module: Module, files: "Crate", child_dir: str, end: str | None) -> None:
        """Reads items until `end` (`}` for an inline module, None for a file)."""
        while self.pos < len(self.tokens):
            tok = self.tokens[self.pos]
            t = tok.text
            if end is not None and t == end:
                self.pos += 1
                return
            if t == "#" and self.peek(1) in ("[", "!"):
                inner = self.peek(1) == "!"
                attr = self.attribute()
                if _is_test_cfg(attr):
                    if inner:  # `#![cfg(test)]`: the whole file
                        module.test_only = True
                        self.pos = len(self.tokens)
                        return
                    while self.peek() == "#" and self.peek(1) == "[":
                        self.attribute()
                    # A test module is not read, whether in a file of its
                    # own or inline; any other item is skipped.
                    if self.peek() == "mod" or (self.peek() == "pub" and "mod" in (self.peek(1), self.peek(4))):
                        self.test_module(module, files, child_dir)
                    else:
                        self.skip_item()
                    continue
                path_attr = re.match(r'^path = "(.*)"$', " ".join(attr), re.S)
                if path_attr:
                    self.pending_path = path_attr.group(1)
                continue
            if t == "pub" and self.peek(1) == "(":
                # `pub(crate)`, `pub(in crate::a)`: a visibility, not a path.
                self.pos += 1
                self.skip_group()
                continue
            if t == "mod" and self.peek(1) not in (None, "::") and self._is_item_start():
                self.module_decl(module, files, child_dir, test=False)
                continue
            if t == "use" and self._is_item_start():
                self.pos += 1
                trees: list[UseTree] = []
                self.use_tree([], trees, tok.line)
                module.uses.extend(trees)
                continue
            if t in ("crate", "self", "super") or re.match(r"^[A-Za-z_]", t):
                self.code_path(module)
                continue
            self.pos += 1
        self.pending_path = None

    pending_path: str | None = None

    def _is_item_start(self) -> bool:
        """Whether the keyword at the current position begins an item (not
        e.g. a field or method named `mod`/`use` after `.` or `::`)."""
        prev = self.tokens[self.pos - 1].text if self.pos else ";"
        return prev not in (".", "::")

    def test_module(self, module: Module, files: "Crate", child_dir: str) -> None:
        if self.peek() == "pub":
            self.pos += 1
            if self.peek() == "(":
                self.skip_group()
        self.module_decl(module, files, child_dir, test=True)

    def module_decl(self, module: Module, files: "Crate", child_dir: str, test: bool) -> None:
        """`mod name;` (a file of its own) or `mod name { … }` (inline)."""
        self.pos += 1
        name = self.peek() or ""
        self.pos += 1
        path_attr, self.pending_path = self.pending_path, None
        if self.peek() == ";":
            self.pos += 1
            if test:
                return
            if path_attr is not None:
                candidates = [os.path.join(child_dir if module.parent and files.is_inline(module) else os.path.dirname(module.file), path_attr)]
            else:
                candidates = [os.path.join(child_dir, name + ".rs"), os.path.join(child_dir, name, "mod.rs")]
            for candidate in candidates:
                candidate = os.path.normpath(candidate)
                if os.path.isfile(candidate):
                    child = Module(module.path + (name,), candidate, module)
                    module.children[name] = child
                    files.read_file(child)
                    return
            return  # generated or missing: nothing to read
        if self.peek() == "{":
            self.pos += 1
            child = Module(module.path + (name,), module.file, module, test_only=test)
            files.inline.add(id(child))
            if test:
                # An inline test module: skip its body.
                self.pos -= 1
                self.skip_group()
                return
            module.children[name] = child
            self.module_body(child, files, os.path.join(child_dir, name), "}")

    def code_path(self, module: Module) -> None:
        """Reads `a::b::c` (or a lone identifier) starting at the current token."""
        prev = self.tokens[self.pos - 1].text if self.pos else ""
        line = self.tokens[self.pos].line
        segments = [self.tokens[self.pos].text]
        self.pos += 1
        while self.peek() == "::" and self.peek(1) is not None and re.match(r"^[A-Za-z_]", self.peek(1) or ""):
            segments.append(self.peek(1) or "")
            self.pos += 2
        # `x.a::b` is not a path; `::a::b` is an external crate's; a lone
        # name is a local item or variable.
        if len(segments) > 1 and prev not in (".", "::", "$"):
            module.paths.append((segments, line))


# ------------------------------------------------------------- the crate ----


class Crate:
    """The module tree of one crate target."""

    def __init__(self, name: str, root_file: str):
        self.name = name
        self.inline: set[int] = set()
        self.modules: list[Module] = []
        self.root = Module((), root_file, None)
        self.read_file(self.root)

    def is_inline(self, module: Module) -> bool:
        return id(module) in self.inline

    def read_file(self, module: Module) -> None:
        try:
            with open(module.file, encoding="utf-8") as f:
                source = f.read()
        except (OSError, UnicodeDecodeError):
            return
        parser = Parser(tokenize(source), source)
        base = os.path.dirname(module.file)
        stem = os.path.splitext(os.path.basename(module.file))[0]
        is_mod_rs = module.parent is None or stem == "mod"
        child_dir = base if is_mod_rs else os.path.join(base, stem)
        parser.module_body(module, self, child_dir, None)

    def all_modules(self) -> list[Module]:
        out, stack = [], [self.root]
        while stack:
            m = stack.pop()
            out.append(m)
            stack.extend(m.children.values())
        return out

    def lookup(self, module: Module, name: str) -> Module | None:
        """A module named `name` in `module`'s scope: a child, an alias or
        what a glob import brings in."""
        if name in module.children:
            return module.children[name]
        if name in module.aliases:
            return module.aliases[name]
        for glob in module.globs:
            if glob is not module and (name in glob.children or name in glob.aliases):
                return glob.children.get(name) or glob.aliases.get(name)
        return None

    def resolve(self, module: Module, segments: list[str]) -> tuple[Module | None, int]:
        """The deepest module `segments` names from `module`, and how many
        segments that took (0: not a path into this crate)."""
        if not segments or segments[0] == "::":
            return None, 0
        first, i = segments[0], 1
        if first == "crate":
            current: Module | None = self.root
        elif first == "self":
            current = module
        elif first == "super":
            current = module.parent
            while i < len(segments) and segments[i] == "super" and current is not None:
                current, i = current.parent, i + 1
        else:
            current = self.lookup(module, first)
        if current is None:
            return None, 0
        while i < len(segments):
            nxt = self.lookup(current, segments[i])
            if nxt is None:
                break
            current, i = nxt, i + 1
        return current, i

    def bind_aliases(self) -> None:
        """Resolves every `use` that names a module, until nothing changes
        (an alias may go through another alias)."""
        modules = self.all_modules()
        changed = True
        while changed:
            changed = False
            for m in modules:
                for use in m.uses:
                    target, taken = self.resolve(m, use.path)
                    if target is None:
                        continue
                    if use.binding is None:
                        if taken == len(use.path) and target not in m.globs:
                            m.globs.append(target)
                            changed = True
                    elif use.binding != "_" and taken == len(use.path) and m.aliases.get(use.binding) is not target:
                        if target is not m:
                            m.aliases[use.binding] = target
                            changed = True

    def edges(self) -> dict[str, dict[str, tuple[int, str]]]:
        """file -> {file it depends on: (line, the path written there)}."""
        self.bind_aliases()
        out: dict[str, dict[str, tuple[int, str]]] = defaultdict(dict)
        for m in self.all_modules():
            if m.test_only:
                continue
            refs = [(u.path if u.binding is None else u.path, u.line) for u in m.uses]
            refs += m.paths
            for segments, line in refs:
                target, taken = self.resolve(m, segments)
                if target is None or target.file == m.file:
                    continue
                out[m.file].setdefault(target.file, (line, "::".join(segments)))
        return out


# ------------------------------------------------------------ the search ----


def strongly_connected(edges: dict[str, dict[str, tuple[int, str]]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively; components of more than one file."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    nodes = sorted(set(edges) | {t for targets in edges.values() for t in targets})
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(edges.get(succ, {})))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def shortest_loop(component: list[str], edges: dict[str, dict[str, tuple[int, str]]]) -> list[str]:
    """A shortest loop through the component's first file, as a file list."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for succ in sorted(edges.get(node, {})):
            if succ not in members:
                continue
            if succ == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return list(reversed(path)) + [start]
            if succ not in previous:
                previous[succ] = node
                queue.append(succ)
    return component + [start]


# ---------------------------------------------------------- the targets ----


def crate_targets(package_dir: str) -> list[tuple[str, str]]:
    """(name, root file) of every target of the package in `package_dir`."""
    with open(os.path.join(package_dir, "Cargo.toml"), "rb") as f:
        manifest = tomllib.load(f)
    package = manifest.get("package", {}).get("name", os.path.basename(package_dir))
    roots: dict[str, str] = {}

    def add(kind: str, name: str, path: str) -> None:
        full = os.path.normpath(os.path.join(package_dir, path))
        if os.path.isfile(full):
            roots.setdefault(full, f"{package} {kind} {name}")

    lib = manifest.get("lib", {})
    add("lib", lib.get("name", package), lib.get("path", "src/lib.rs"))
    for kind, section, folder in (
        ("bin", "bin", "src/bin"),
        ("test", "test", "tests"),
        ("bench", "bench", "benches"),
        ("example", "example", "examples"),
    ):
        for target in manifest.get(section, []):
            if "path" in target:
                add(kind, target.get("name", ""), target["path"])
            elif "name" in target:
                add(kind, target["name"], os.path.join(folder, target["name"] + ".rs"))
                add(kind, target["name"], os.path.join(folder, target["name"], "main.rs"))
        if kind == "bin":
            add(kind, package, "src/main.rs")
        # Targets cargo finds on its own.
        auto = os.path.join(package_dir, folder)
        if os.path.isdir(auto):
            for entry in sorted(os.listdir(auto)):
                full = os.path.join(auto, entry)
                if entry.endswith(".rs"):
                    add(kind, entry[:-3], os.path.join(folder, entry))
                elif os.path.isfile(os.path.join(full, "main.rs")):
                    add(kind, entry, os.path.join(folder, entry, "main.rs"))
    return [(name, root) for root, name in roots.items()]


def packages(root: str) -> list[str]:
    """Every directory under `root` holding a Cargo.toml with a [package]."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith(".") and d not in ("target", "node_modules")
        )
        if "Cargo.toml" in filenames:
            with open(os.path.join(dirpath, "Cargo.toml"), "rb") as f:
                try:
                    if "package" in tomllib.load(f):
                        out.append(dirpath)
                except tomllib.TOMLDecodeError:
                    continue
    return out


def find_loops(
    root: str, verbose: bool = False, skip: tuple[str, ...] = ()
) -> tuple[list[str], list[str], int, int]:
    """Every loop in the workspace at `root`, one printable line each (with
    `verbose`, each followed by indented lines: the edges inside it): those
    that count, those lying wholly under one of the `skip` directories
    (relative to `root`), and how many targets and files were read."""
    counted: list[str] = []
    skipped: list[str] = []
    skip_dirs = [os.path.normpath(os.path.join(root, d)) for d in skip]
    targets = files = 0
    for package_dir in packages(root):
        for name, root_file in crate_targets(package_dir):
            crate = Crate(name, root_file)
            targets += 1
            files += len({m.file for m in crate.all_modules()})
            edges = crate.edges()
            for component in strongly_connected(edges):
                loop = shortest_loop(component, edges)
                steps = []
                for a, b in zip(loop, loop[1:]):
                    line, written = edges[a][b]
                    steps.append(f"{os.path.relpath(a, root)}:{line} ({written})")
                more = len(component) - (len(loop) - 1)
                extra = f" [and {more} more files in this loop]" if more > 0 else ""
                lines = [f"{name}: " + " -> ".join(steps) + f" -> {os.path.relpath(loop[-1], root)}{extra}"]
                if verbose:
                    for member in component:
                        inside = sorted(t for t in edges[member] if t in component)
                        lines.append(f"    {os.path.relpath(member, root)} -> " + ", ".join(
                            f"{os.path.relpath(t, root)} ({edges[member][t][1]}:{edges[member][t][0]})" for t in inside))
                under_skip = any(
                    all(_is_under(member, d) for member in component) for d in skip_dirs
                )
                (skipped if under_skip else counted).extend(lines)
    return counted, skipped, targets, files


def _is_under(path: str, directory: str) -> bool:
    return os.path.commonpath([os.path.abspath(path), os.path.abspath(directory)]) == os.path.abspath(directory)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=os.path.basename(argv[0]) if argv else "check-module-cycles.py",
        description="Fails when files of one crate import each other in a loop.",
    )
    parser.add_argument("--verbose", action="store_true", help="every edge inside each loop's files")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="DIR",
        help="list, but do not fail on, a loop whose files all lie under DIR (relative to ROOT); repeatable",
    )
    parser.add_argument("root", nargs="?", help="the workspace (default: this script's repository)")
    args = parser.parse_args(argv[1:])
    root = args.root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for d in args.skip:
        if not os.path.isdir(os.path.join(root, d)):
            print(f"--skip {d}: no such directory under {root}", file=sys.stderr)
            return 2
    loops, skipped, targets, files = find_loops(root, args.verbose, tuple(args.skip))
    for line in skipped:
        print(f"skipped: {line}" if not line.startswith(" ") else line)
    for line in loops:
        print(line)
    count = sum(1 for line in loops if not line.startswith(" "))
    if count:
        print(f"{count} import loop(s) between files (see CONTRIBUTING.md)")
        return 1
    known = sum(1 for line in skipped if not line.startswith(" "))
    note = f", {known} loop(s) skipped under {', '.join(args.skip)}" if known else ""
    print(f"no import loops: {targets} crate targets, {files} files{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
