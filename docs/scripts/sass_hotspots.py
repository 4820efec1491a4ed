"""Where a profiled kernel's warps wait, from ncu's SASS source page (issue 15: what holds the 16-row W4A16 GEMM).

    ncu --import R.ncu-rep --page source --print-source sass --csv > R_sass.csv
    python3 docs/scripts/sass_hotspots.py R_sass.csv [TOP]

ncu writes one table a profiled kernel, each headed by its own column line. For each table: the stall samples by
opcode (the first word of the SASS text, predicate dropped), and the TOP instructions with the most samples, with
their executed count. Columns are found by name, so ncu versions that add columns still parse.
"""

import collections
import csv
import sys


def tables(path):
    """Yields (header, rows) for each table in the CSV: a row whose first cell names the address column starts one."""
    header, rows = None, []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if row and "Address" in row[0]:
                if header:
                    yield header, rows
                header, rows = row, []
            elif header and len(row) == len(header):
                rows.append(row)
    if header:
        yield header, rows


def column(header, *names):
    for name in names:
        for i, title in enumerate(header):
            if title.strip() == name:
                return i
    for name in names:
        for i, title in enumerate(header):
            if name.lower() in title.lower():
                return i
    return None


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(source):
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def report(header, rows, top):
    src = column(header, "Source")
    samples = column(header, "Warp Stall Sampling (All Samples)", "Warp Stall Sampling")
    executed = column(header, "Instructions Executed")
    if src is None or samples is None:
        print("  no Source / stall sampling columns:", header[:8])
        return
    total = sum(number(r[samples]) for r in rows) or 1.0
    by_op = collections.Counter()
    for r in rows:
        by_op[opcode(r[src])] += number(r[samples])
    print(f"  {len(rows)} instructions, {int(total)} stall samples")
    print("  by opcode: " + ", ".join(f"{op} {100 * n / total:.1f}%" for op, n in by_op.most_common(14)))
    ranked = sorted(rows, key=lambda r: -number(r[samples]))[:top]
    for r in ranked:
        ran = f" x{int(number(r[executed]))}" if executed is not None else ""
        print(f"  {100 * number(r[samples]) / total:5.1f}%  {r[0]:>6}  {r[src].strip()[:90]}{ran}")


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    for i, (header, rows) in enumerate(tables(path)):
        print(f"kernel {i}:")
        report(header, rows, top)


if __name__ == "__main__":
    main()
