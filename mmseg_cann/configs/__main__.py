"""``python -m mmseg_cann.configs``: list, locate and copy the shipped configs.

    python -m mmseg_cann.configs list [--filter TEXT] [--bases]
    python -m mmseg_cann.configs path NAME
    python -m mmseg_cann.configs copy NAME DEST [--force]

``copy`` writes the config and the local bases it inherits under DEST, keeping their
relative layout, and prints the ``_base_`` line to put in your own config. Mistakes (an
unknown name, a clashing file) print one line and exit with code 2.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from . import ConfigNotFound, config_path, config_root, copy_config, list_configs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='python -m mmseg_cann.configs',
        description='List, locate and copy the configs shipped with mmseg-cann.')
    sub = parser.add_subparsers(dest='command', required=True)
    listing = sub.add_parser('list', help='print every shipped config name')
    listing.add_argument('--filter', default='', help='only names containing this text')
    listing.add_argument('--bases', action='store_true', help='include the _base_ files')
    path = sub.add_parser('path', help='print the absolute path of one config')
    path.add_argument('name', help="e.g. 'medical/unet-s5-d16_fcn_cann_4xb4-40k_drive-64x64.py'")
    copy = sub.add_parser('copy', help='copy a config and its local bases into a folder')
    copy.add_argument('name', help='config name, as printed by `list` (or its file name)')
    copy.add_argument('dest', help='destination folder (created if missing)')
    copy.add_argument('--force', action='store_true',
                      help='replace differing files already in DEST')
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == 'list':
            print(f'# configs in {config_root()}')
            for name in list_configs(include_bases=args.bases):
                if args.filter in name:
                    print(name)
        elif args.command == 'path':
            print(config_path(args.name))
        else:
            written = copy_config(args.name, args.dest, overwrite=args.force)
            for path in written:
                print(f'wrote {path}')
            rel = os.path.relpath(written[0]).replace(os.sep, '/')
            print(f"inherit it in your config: _base_ = ['./{rel}']  "
                  f'(relative to your config file)')
    except (ConfigNotFound, FileExistsError, FileNotFoundError, TypeError) as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main())
