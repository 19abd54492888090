#!/usr/bin/env python3
"""Unit tests of guest-tests/check_output.py: exact and regex comparison, and what it reports on a mismatch."""
import os
import subprocess
import sys
import tempfile
import unittest

CHECKER = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "..", "guest-tests", "check_output.py")


class CheckOutputTest(unittest.TestCase):
    def run_checker(self, expected_name, expected, actual):
        with tempfile.TemporaryDirectory() as directory:
            expected_path = os.path.join(directory, expected_name)
            actual_path = os.path.join(directory, "actual.out")
            with open(expected_path, "wb") as f:
                f.write(expected)
            with open(actual_path, "wb") as f:
                f.write(actual)
            result = subprocess.run([sys.executable, CHECKER, expected_path, actual_path], capture_output=True)
            return result.returncode, result.stdout.decode()

    def test_exact_match(self):
        self.assertEqual(self.run_checker("g.expected", b"a\nb\n", b"a\nb\n")[0], 0)

    def test_exact_reports_first_differing_line(self):
        code, out = self.run_checker("g.expected", b"a\nb\nc\n", b"a\nx\nc\n")
        self.assertEqual(code, 1)
        self.assertIn("line 2", out)
        self.assertIn("'b'", out)
        self.assertIn("'x'", out)

    def test_exact_rejects_carriage_returns(self):
        self.assertEqual(self.run_checker("g.expected", b"a\nb\n", b"a\r\nb\r\n")[0], 1)

    def test_exact_rejects_missing_and_extra_output(self):
        self.assertEqual(self.run_checker("g.expected", b"a\nb\n", b"a\n")[0], 1)
        self.assertEqual(self.run_checker("g.expected", b"a\n", b"a\nb\n")[0], 1)
        self.assertEqual(self.run_checker("g.expected", b"a\n", b"a")[0], 1)

    def test_regex_matches_whole_lines(self):
        self.assertEqual(self.run_checker("g.expected-re", b"n=[0-9]+\nend\n", b"n=42\nend\n")[0], 0)
        code, out = self.run_checker("g.expected-re", b"n=[0-9]+\nend\n", b"n=42x\nend\n")
        self.assertEqual(code, 1)
        self.assertIn("line 1", out)

    def test_regex_requires_equal_line_counts(self):
        self.assertEqual(self.run_checker("g.expected-re", b"a\n", b"a\nb\n")[0], 1)
        self.assertEqual(self.run_checker("g.expected-re", b"a\nb\n", b"a\n")[0], 1)

    def test_unreadable_file_is_an_error_not_a_match(self):
        result = subprocess.run([sys.executable, CHECKER, "/nonexistent/x.expected", "/nonexistent/y"],
                                capture_output=True)
        self.assertEqual(result.returncode, 2)
        self.assertIn("/nonexistent", result.stderr.decode())


if __name__ == "__main__":
    unittest.main()
