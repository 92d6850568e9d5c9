#!/usr/bin/env python3
"""Tests of check-module-cycles.py on small crates written for each case.

Run: python3 -m unittest discover -s scripts -p 'test_*.py'
"""

import contextlib
import importlib.util
import io
import os
import sys
import tempfile
import textwrap
import unittest

_HERE = os.path.dirname(os.path.abspath(__file__))
_SPEC = importlib.util.spec_from_file_location(
    "check_module_cycles", os.path.join(_HERE, "check-module-cycles.py")
)
assert _SPEC is not None and _SPEC.loader is not None
checker = importlib.util.module_from_spec(_SPEC)
sys.modules["check_module_cycles"] = checker
_SPEC.loader.exec_module(checker)


class Workspace:
    """A temporary workspace of crates whose files a test writes."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory()
        self.root = self._dir.name

    def crate(self, name: str, files: dict[str, str], manifest_extra: str = "") -> None:
        base = os.path.join(self.root, name)
        os.makedirs(base, exist_ok=True)
        with open(os.path.join(base, "Cargo.toml"), "w", encoding="utf-8") as f:
            f.write(f'[package]\nname = "{name}"\nversion = "0.1.0"\n{manifest_extra}')
        for path, text in files.items():
            full = os.path.join(base, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(textwrap.dedent(text))

    def loops(self) -> list[str]:
        lines, _, _, _ = checker.find_loops(self.root)
        return lines

    def close(self) -> None:
        self._dir.cleanup()


class CycleTests(unittest.TestCase):
    def setUp(self) -> None:
        self.ws = Workspace()

    def tearDown(self) -> None:
        self.ws.close()

    def assert_loop(self, files: dict[str, str], *members: str) -> None:
        self.ws.crate("c", files)
        loops = self.ws.loops()
        self.assertEqual(len(loops), 1, loops)
        for member in members:
            self.assertIn(f"c/src/{member}", loops[0])

    def assert_no_loop(self, files: dict[str, str]) -> None:
        self.ws.crate("c", files)
        self.assertEqual(self.ws.loops(), [])

    def test_two_files_importing_each_other(self) -> None:
        self.assert_loop(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": "use crate::b::B;\npub struct A;\n",
                "src/b.rs": "use crate::a::A;\npub struct B;\n",
            },
            "a.rs:1 (crate::b::B)",
            "b.rs:1 (crate::a::A)",
        )

    def test_one_direction_is_no_loop(self) -> None:
        self.assert_no_loop(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": "use crate::b::B;\n",
                "src/b.rs": "pub struct B;\n",
            }
        )

    def test_a_loop_around_three_files(self) -> None:
        self.assert_loop(
            {
                "src/lib.rs": "mod a;\nmod b;\nmod c;\n",
                "src/a.rs": "use crate::b::B;\n",
                "src/b.rs": "use crate::c::C;\n",
                "src/c.rs": "use crate::a::A;\n",
            },
            "a.rs",
            "b.rs",
            "c.rs",
        )

    def test_use_trees_with_braces_and_self(self) -> None:
        self.assert_loop(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": "use crate::{\n    x::{self, Y},\n    b::{self as other, B},\n};\n",
                "src/b.rs": "pub mod inner { pub struct I; }\nuse super::a;\n",
                "src/x.rs": "",
            },
            "a.rs",
            "b.rs",
        )

    def test_a_module_bound_by_use_resolves_later_paths(self) -> None:
        # `use crate::b;` alone reaches b/mod.rs; `b::deep::f()` reaches b/deep.rs.
        self.assert_loop(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": "use crate::b;\nfn f() { b::deep::g(); }\n",
                "src/b/mod.rs": "pub mod deep;\n",
                "src/b/deep.rs": "pub fn g() { crate::a::h() }\n",
            },
            "a.rs",
            "b/deep.rs",
        )

    def test_super_super(self) -> None:
        self.assert_loop(
            {
                "src/lib.rs": "mod top;\nmod x;\n",
                "src/top/mod.rs": "mod mid;\n",
                "src/top/mid/mod.rs": "mod leaf;\n",
                "src/top/mid/leaf.rs": "use super::super::super::x::X;\n",
                "src/x.rs": "use crate::top::mid::leaf;\n",
            },
            "top/mid/leaf.rs",
            "x.rs",
        )

    def test_a_parent_that_only_declares_its_children_is_no_loop(self) -> None:
        self.assert_no_loop(
            {
                "src/lib.rs": "pub mod p;\n",
                "src/p/mod.rs": "//! Docs: [`child::C`].\npub mod child;\npub struct Shared;\n",
                "src/p/child.rs": "use super::Shared;\npub struct C;\n",
            }
        )

    def test_a_parent_re_exporting_from_a_child_that_imports_it(self) -> None:
        self.assert_loop(
            {
                "src/lib.rs": "pub mod p;\n",
                "src/p/mod.rs": "mod child;\npub use child::C;\npub struct Shared;\n",
                "src/p/child.rs": "use super::Shared;\npub struct C;\n",
            },
            "p/mod.rs",
            "p/child.rs",
        )

    def test_a_re_export_through_a_facade(self) -> None:
        # `pub use self::a::A as Alias` in lib.rs; b names `crate::Alias`.
        self.assert_loop(
            {
                "src/lib.rs": "mod a;\nmod b;\npub use self::a::A as Alias;\n",
                "src/a.rs": "pub struct A;\nfn f() { crate::b::g() }\n",
                "src/b.rs": "pub fn g() {}\nfn h(_: crate::Alias) {}\n",
            },
            "lib.rs",
            "a.rs",
            "b.rs",
        )

    def test_an_inline_module_is_part_of_its_file(self) -> None:
        self.assert_loop(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": "pub mod inner {\n    use crate::b::B;\n}\npub struct A;\n",
                "src/b.rs": "use crate::a::inner;\npub struct B;\n",
            },
            "a.rs",
            "b.rs",
        )

    def test_a_file_module_under_an_inline_module(self) -> None:
        self.assert_loop(
            {
                "src/lib.rs": "mod outer {\n    pub mod leaf;\n}\nmod b;\n",
                "src/outer/leaf.rs": "use crate::b::B;\n",
                "src/b.rs": "use crate::outer::leaf::L;\n",
            },
            "outer/leaf.rs",
            "b.rs",
        )

    def test_test_modules_may_import_anything(self) -> None:
        self.assert_no_loop(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": textwrap.dedent(
                    """\
                    pub struct A;
                    #[cfg(test)]
                    #[allow(clippy::unwrap_used)]
                    mod tests {
                        use crate::b::B;
                        use super::*;
                    }
                    #[cfg(test)]
                    mod more_tests;
                    #[cfg(test)]
                    fn helper() -> crate::b::B { crate::b::B }
                    #[cfg(test)]
                    use crate::b::B as _;
                    struct S {
                        #[cfg(test)]
                        field: crate::b::B,
                        other: u8,
                    }
                    """
                ),
                "src/a/more_tests.rs": "use crate::b::B;\n",
                "src/b.rs": "use crate::a::A;\npub struct B;\n",
            }
        )

    def test_code_after_a_test_item_is_still_read(self) -> None:
        self.assert_loop(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": "#[cfg(test)]\nmod tests {}\nuse crate::b::B;\n",
                "src/b.rs": "use crate::a::A;\n",
            },
            "a.rs",
            "b.rs",
        )

    def test_comments_strings_and_lifetimes_are_not_paths(self) -> None:
        self.assert_no_loop(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": textwrap.dedent(
                    """\
                    //! See [`crate::b::B`].
                    /* crate::b::B /* nested */ crate::b::B */
                    pub struct A<'a>(&'a str);
                    const S: &str = "crate::b::B";
                    const R: &str = r#"use crate::b::B; "quoted" "#;
                    const C: char = '"';
                    """
                ),
                "src/b.rs": "use crate::a::A;\n",
            }
        )

    def test_a_path_in_an_expression(self) -> None:
        self.assert_loop(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": "fn f() { let _ = crate::b::g(); }\n",
                "src/b.rs": "pub fn g() {}\nfn h() { super::a::f() }\n",
            },
            "a.rs",
            "b.rs",
        )

    def test_a_glob_import(self) -> None:
        self.assert_loop(
            {
                "src/lib.rs": "mod p;\n",
                "src/p/mod.rs": "mod x;\nmod y;\npub struct P;\nfn f() { x::g() }\n",
                "src/p/x.rs": "use super::*;\npub fn g() {}\n",
                "src/p/y.rs": "",
            },
            "p/mod.rs",
            "p/x.rs",
        )

    def test_a_path_attribute(self) -> None:
        self.assert_loop(
            {
                "src/lib.rs": '#[path = "elsewhere/impl_a.rs"]\nmod a;\nmod b;\n',
                "src/elsewhere/impl_a.rs": "use crate::b::B;\n",
                "src/b.rs": "use crate::a::A;\n",
            },
            "elsewhere/impl_a.rs",
            "b.rs",
        )

    def test_external_crates_and_method_calls_are_not_modules(self) -> None:
        self.assert_no_loop(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": "use ::b::X;\nfn f(x: Y) { x.b::<u8>(); std::b::c(); }\n",
                "src/b.rs": "use crate::a::A;\n",
            }
        )

    def test_each_target_is_a_crate_of_its_own(self) -> None:
        # main.rs's `crate` is the binary; it names the library by its name.
        self.assert_no_loop(
            {
                "src/lib.rs": "pub mod a;\n",
                "src/a.rs": "pub fn f() {}\n",
                "src/main.rs": "mod cli;\nfn main() { cli::run() }\n",
                "src/cli.rs": "pub fn run() { c::a::f() }\n",
                "tests/it.rs": "mod helpers;\nuse helpers::H;\n",
                "tests/helpers/mod.rs": "pub struct H;\n",
            }
        )

    def test_a_loop_in_a_binary_target(self) -> None:
        self.ws.crate(
            "c",
            {
                "src/lib.rs": "",
                "src/main.rs": "mod a;\nmod b;\n",
                "src/a.rs": "use crate::b::B;\n",
                "src/b.rs": "use crate::a::A;\n",
            },
        )
        loops = self.ws.loops()
        self.assertEqual(len(loops), 1, loops)
        self.assertTrue(loops[0].startswith("c bin "), loops)

    def test_the_exit_status(self) -> None:
        self.ws.crate("c", {"src/lib.rs": "mod a;\n", "src/a.rs": "use crate::a::A;\n"})
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(checker.main(["check", self.ws.root]), 0)
        self.assertIn("no import loops: 1 crate targets, 2 files", out.getvalue())
        self.ws.crate("d", {"src/lib.rs": "mod a;\nmod b;\n", "src/a.rs": "use crate::b::B;\n", "src/b.rs": "use crate::a::A;\n"})
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(checker.main(["check", self.ws.root]), 1)
        self.assertIn("1 import loop(s)", out.getvalue())


    def test_a_restricted_visibility_is_not_a_path(self) -> None:
        self.assert_no_loop(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": "use crate::b::f;\npub(crate) fn g() { f() }\n",
                "src/b.rs": "pub(in crate::a) fn h() {}\npub(crate) fn f() {}\n",
            }
        )

    def test_a_skipped_directory_lists_its_loops_but_does_not_fail(self) -> None:
        looping = {
            "src/lib.rs": "mod a;\nmod b;\nmod sim;\n",
            "src/a.rs": "pub struct A;\n",
            "src/b.rs": "pub struct B;\n",
            "src/sim/mod.rs": "mod x;\nmod y;\n",
            "src/sim/x.rs": "use super::y::Y;\npub struct X;\n",
            "src/sim/y.rs": "use super::x::X;\npub struct Y;\n",
        }
        self.ws.crate("c", looping)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(checker.main(["check", "--skip", "c/src/sim", self.ws.root]), 0)
        self.assertIn("skipped: c lib c: c/src/sim/", out.getvalue())
        self.assertIn("1 loop(s) skipped under c/src/sim", out.getvalue())
        # Without --skip the same loop fails.
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertEqual(checker.main(["check", self.ws.root]), 1)

    def test_a_loop_reaching_out_of_a_skipped_directory_still_fails(self) -> None:
        self.ws.crate(
            "c",
            {
                "src/lib.rs": "mod a;\nmod sim;\n",
                "src/a.rs": "use crate::sim::x::X;\npub struct A;\n",
                "src/sim/mod.rs": "pub mod x;\n",
                "src/sim/x.rs": "use crate::a::A;\npub struct X;\n",
            },
        )
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(checker.main(["check", "--skip", "c/src/sim", self.ws.root]), 1)
        self.assertIn("1 import loop(s)", out.getvalue())
        self.assertNotIn("skipped:", out.getvalue())

    def test_skipping_a_directory_that_does_not_exist_is_an_error(self) -> None:
        self.ws.crate("c", {"src/lib.rs": ""})
        with contextlib.redirect_stderr(io.StringIO()) as err:
            self.assertEqual(checker.main(["check", "--skip", "nowhere", self.ws.root]), 2)
        self.assertIn("--skip nowhere", err.getvalue())


class LexerTests(unittest.TestCase):
    def test_tokens_and_lines(self) -> None:
        tokens = checker.tokenize('use a::b; // c::d\n"e::f" x\n/* g */ y')
        self.assertEqual(
            [(t.text, t.line) for t in tokens],
            [("use", 1), ("a", 1), ("::", 1), ("b", 1), (";", 1), ('"e::f"', 2), ("x", 2), ("y", 3)],
        )

    def test_raw_identifiers(self) -> None:
        self.assertEqual([t.text for t in checker.tokenize("r#type::x")], ["type", "::", "x"])


if __name__ == "__main__":
    unittest.main()
