#!/usr/bin/env python
"""Check the environment for mmseg_cann (same as ``python -m mmseg_cann.env_check``).

    python tools/env_check.py [--json OUT]
"""
import sys

from mmseg_cann.env_check import main

if __name__ == '__main__':
    sys.exit(main())
