"""Writes the corpus of bad traces that every trace reader must refuse the same way: the
command (tools/check_cli.cmake, case bad_trace_corpus) and the Python package
(tests/python/test_trace_reader.py) both read expected.tsv and check that each file is
refused with an error naming the file, the line and the reason given there.

Each case is a file here; expected.tsv has one line per case: the file, the line the
error names, and a regular expression the message must match. Run this script to write
them again after changing a case: python3 tests/data/bad_traces/make.py
"""

import gzip
import os

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = b"# vramkit-trace v1 workload=bad\n"

# name -> (content, line named, message pattern). Each exercises one rule of the grammar
# in include/vramkit.h.
CASES = {
    # A NUL used to end the line silently: the rest of it was never seen.
    "nul_in_line.trace": (HEADER + b"a 0 4096 0 1\x00 junk\nf 0 0 2\n", 2,
                          r"a NUL byte \('\\x00'\) at column 13"),
    # A NUL in a line longer than the old line buffer: its tail parsed as a hidden op.
    "nul_hidden_op.trace": (HEADER + b"a 0 1 0 1\x00" + b"x" * 4085 +
                            b"a 9 1073741824 0 1\nf 0 0 2\n", 2, r"a NUL byte"),
    # Megabytes of NULs after the header passed as one empty line.
    "nul_run.trace.gz": (gzip.compress(HEADER + b"\x00" * (10 << 20), 9, mtime=0), 2,
                         r"a NUL byte"),
    # Separators other than blank and tab: python's reader took \v and \f, replay did not.
    "vertical_tab.trace": (HEADER + b"a 0 4096\x0b0 1\n", 2, r"a control byte \('\\x0b'\)"),
    "form_feed.trace": (HEADER + b"a 0 4096 0\x0c1\n", 2, r"a control byte \('\\x0c'\)"),
    "control_in_comment.trace": (HEADER + b"# a bell \x07 here\n", 2, r"a control byte"),
    "carriage_return_inside.trace": (HEADER + b"a 0 4096\r0 1\n", 2,
                                     r"a carriage return inside a line"),
    "non_ascii.trace": (HEADER + b"# caf\xc3\xa9\n", 2, r"a byte outside ASCII \('\\xc3'\)"),
    "long_comment.trace": (HEADER + b"#" + b"x" * 5000 + b"\n", 2,
                           r"line longer than 4095 bytes"),
    "unknown_event.trace": (HEADER + b"x 1 2\n", 2, r"unknown event 'x'"),
    "too_few_fields.trace": (HEADER + b"a 0 4096 0\n", 2, r"'a' event with 3 fields"),
    "negative_size.trace": (HEADER + b"a 0 -1 0 1\n", 2,
                            r"SIZE '-1' is not an unsigned 64-bit decimal number"),
    "size_past_64_bits.trace": (HEADER + b"a 0 18446744073709551616 0 1\n", 2,
                                r"SIZE '18446744073709551616' is not an unsigned 64-bit"),
    "id_out_of_range.trace": (HEADER + b"a 18446744073709551615 1 0 1\n", 2,
                              r"ID 18446744073709551615 is out of range"),
    "allocated_twice.trace": (HEADER + b"a 7 1 0 1\na 7 1 0 2\n", 3,
                              r"block ID 7 allocated again while still live"),
    "no_header.trace": (b"a 0 1 0 1\n", 1, r"not a vramkit trace"),
    "other_version.trace": (b"# vramkit-trace v2\na 0 1 0 1\n", 1,
                            r"trace format 'v2' is not one this vramkit reads"),
}


def main():
    with open(os.path.join(HERE, "expected.tsv"), "w") as manifest:
        manifest.write("# file\tline\tmessage pattern (written by make.py)\n")
        for name, (content, line, pattern) in CASES.items():
            with open(os.path.join(HERE, name), "wb") as f:
                f.write(content)
            manifest.write(f"{name}\t{line}\t{pattern}\n")


if __name__ == "__main__":
    main()
