# SPDX-License-Identifier: BSD-3-Clause
"""Benchmarks, run from a checkout: ``python -m benchmarks.sm90`` (the Hopper GEMMs against
their peers) and ``python -m benchmarks.linear`` (FP4 layers against BF16 and torchao)."""
