#!/usr/bin/env python
"""Print (and save) the precision table: fp16/bf16 pooling and upsampling errors.

    python tools/precision_report.py --json precision.json --markdown precision.md

Every cell is the largest error in units in the last place (ulps) of the input dtype,
against a float64 reference of the same input. See mmseg_cann/analysis/precision_report.py.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from _common import UserError, add_debug, check_output, run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--height', type=int, default=64)
    parser.add_argument('--width', type=int, default=128)
    parser.add_argument('--offset', type=float, default=100.0,
                        help='common offset of the inputs (default: %(default)s)')
    parser.add_argument('--json', metavar='OUT', help='write the rows as JSON')
    parser.add_argument('--markdown', metavar='OUT', help='write the Markdown table')
    add_debug(parser)
    args = parser.parse_args(argv)
    for path, what in ((args.json, '--json'), (args.markdown, '--markdown')):
        if path:
            check_output(path, what)
    if args.height < 1 or args.width < 1:
        raise UserError(f'--height and --width must be positive, got {args.height} '
                        f'{args.width}')

    from mmseg_cann.analysis import precision_report as report

    rows = report.build_rows(args.height, args.width, offset=args.offset)
    table = report.format_markdown(rows)
    print(f'max error in ulps of the input dtype; inputs {args.offset:g} + U[0, 1), '
          f'maps {args.height}x{args.width}')
    print(table)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump([dataclasses.asdict(r) for r in rows], f, indent=1)
    if args.markdown:
        with open(args.markdown, 'w') as f:
            f.write(table + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(run(main, 'precision_report'))
