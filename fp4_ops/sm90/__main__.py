# SPDX-License-Identifier: BSD-3-Clause
"""``python -m fp4_ops.sm90 --mnkl M,N,K,L ...``: the Hopper kernel's command line."""

import sys

from fp4_ops.sm90.cli import main

sys.exit(main())
