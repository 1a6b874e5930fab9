#!/usr/bin/env python3
"""Entry point: `python build.py --profile mtp-cp-recompute`. See README.md."""
import sys

from mtpimage.cli import main

if __name__ == "__main__":
    sys.exit(main())
