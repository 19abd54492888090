#!/usr/bin/env python3
"""Compares a guest's serial output with its expected text (exact bytes) or expected regexes (one per line)."""
import re
import sys


def first_difference_exact(expected: bytes, actual: bytes):
    exp_lines = expected.split(b"\n")
    act_lines = actual.split(b"\n")
    for number, (e, a) in enumerate(zip(exp_lines, act_lines), start=1):
        if e != a:
            return number, e.decode(errors="backslashreplace"), a.decode(errors="backslashreplace")
    # One is a prefix of the other: report the first line only one side has.
    number = min(len(exp_lines), len(act_lines)) + 1
    e = exp_lines[number - 1].decode(errors="backslashreplace") if number <= len(exp_lines) else "<end of output>"
    a = act_lines[number - 1].decode(errors="backslashreplace") if number <= len(act_lines) else "<end of output>"
    return number, e, a


def check_regex(patterns_text: str, actual: bytes):
    """Each pattern line must match the whole corresponding output line; line counts must agree."""
    patterns = patterns_text.split("\n")
    if patterns and patterns[-1] == "":
        patterns.pop()
    text = actual.decode(errors="backslashreplace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        return len(lines), "(output ending in a newline)", lines[-1] + "  <- no final newline"
    for number, pattern in enumerate(patterns, start=1):
        if number > len(lines):
            return number, pattern, "<end of output>"
        try:
            matched = re.fullmatch(pattern, lines[number - 1]) is not None
        except re.error as error:
            return number, pattern, f"<invalid regex: {error}>"
        if not matched:
            return number, pattern, lines[number - 1]
    if len(lines) > len(patterns):
        return len(patterns) + 1, "<end of output>", lines[len(patterns)]
    return None


def main(argv):
    if len(argv) != 3:
        print(f"usage: {argv[0]} EXPECTED_FILE ACTUAL_OUTPUT_FILE", file=sys.stderr)
        print("  EXPECTED_FILE ending in -re holds one regex per output line; otherwise exact text.", file=sys.stderr)
        return 2
    expected_path, actual_path = argv[1], argv[2]
    try:
        with open(expected_path, "rb") as f:
            expected = f.read()
        with open(actual_path, "rb") as f:
            actual = f.read()
    except OSError as error:
        print(f"check_output: cannot read {error.filename}: {error.strerror}", file=sys.stderr)
        return 2
    if expected_path.endswith("-re"):
        difference = check_regex(expected.decode(), actual)
    else:
        difference = None if expected == actual else first_difference_exact(expected, actual)
    if difference is None:
        return 0
    number, e, a = difference
    kind = "pattern" if expected_path.endswith("-re") else "expected"
    print(f"{actual_path}: line {number} differs from {expected_path}")
    print(f"  {kind}: {e!r}" if kind == "expected" else f"  {kind}: {e}")
    print(f"  actual:   {a!r}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
