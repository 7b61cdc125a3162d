"""Digests of every kernel the CPU tests cross-compile: a refactor that must not change the
generated code is checked by comparing two runs' JSON files.

    python -m tools.cubin_digest before.json          # on one commit
    python -m tools.cubin_digest after.json           # on another
    python -m tools.cubin_digest --compare before.json after.json

Each entry is the sha256 of the cubin and of its SASS (``cuobjdump -sass`` without the kernels'
symbol names, which embed the Python module's path), for the
configurations of tests/test_blackwell.py (ARCH_MATRIX), tests/test_hopper.py (COMPILE_CONFIGS,
W4A16_COMPILE) and every quantizer configuration for sm_90a, sm_100a and sm_100f.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile


def _digest(folder: str) -> dict:
    from fp4_ops.devtools import find_cuobjdump

    (cubin,) = glob.glob(os.path.join(folder, "*.cubin"))
    with open(cubin, "rb") as f:
        data = f.read()
    sass = subprocess.run(
        [find_cuobjdump(), "-sass", cubin], capture_output=True, text=True, check=True
    ).stdout
    # (kernel symbols embed the Python module's path: a moved file renames them, nothing else)
    sass = "\n".join(line for line in sass.splitlines() if "Function :" not in line)
    return {
        "cubin": hashlib.sha256(data).hexdigest(),
        "sass": hashlib.sha256(sass.encode()).hexdigest(),
    }


def digests() -> dict:
    import blockwise_gemm_fp4 as bw
    from fp4_ops import quantizer
    from fp4_ops.sm90 import gemm as k90
    from tests import test_blackwell, test_hopper

    out = {}
    for arch, cfg in test_blackwell.ARCH_MATRIX:
        (vec, sf), c_dtype, tile, cluster = cfg
        with tempfile.TemporaryDirectory() as d:
            sms = bw.B200_SM_COUNT // (cluster[0] * cluster[1])
            bw.compile_gemm(vec, sf, c_dtype, tile, cluster, sms, arch, d)
            out[f"sm100 {arch} {cfg}"] = _digest(d)
    hopper = [
        (*c[:5], c[5] if len(c) > 5 else True, c[6] if len(c) > 6 else 1, "Float4E2M1FN")
        for c in test_hopper.COMPILE_CONFIGS
    ]
    hopper += [
        (v, c, p, t, s, tma, kg, a) for v, a, c, p, t, s, tma, kg in test_hopper.W4A16_COMPILE
    ]
    for vec, c_dtype, path, tiler, split, tma, k_groups, a_dtype in hopper:
        with tempfile.TemporaryDirectory() as d:
            opts = f"--gpu-arch sm_90a --keep-cubin --dump-dir={d}"
            k90.compile_gemm(
                vec,
                c_dtype,
                path,
                tiler,
                split,
                k90.H200_SM_COUNT,
                opts,
                None,
                tma,
                k_groups,
                a_dtype,
            )
            key = (vec, c_dtype, path, tiler, split, tma, k_groups, a_dtype)
            out[f"sm90 {key}"] = _digest(d)
    for arch in ("sm_90a", "sm_100a", "sm_100f"):
        for in_dtype in sorted(quantizer.IN_DTYPES):
            for vec, dynamic in ((16, False), (16, True), (32, False)):
                with tempfile.TemporaryDirectory() as d:
                    opts = f"--gpu-arch {arch} --keep-cubin --dump-dir={d}"
                    quantizer.compile_quantizer(in_dtype, vec, dynamic, options=opts)
                    out[f"quantizer {arch} {in_dtype} {vec} {dynamic}"] = _digest(d)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", help="OUT.json, or with --compare: BEFORE.json AFTER.json")
    p.add_argument("--compare", action="store_true")
    args = p.parse_args(argv)
    if not args.compare:
        with open(args.files[0], "w") as f:
            json.dump(digests(), f, indent=1, sort_keys=True)
        return 0
    before, after = (json.load(open(path)) for path in args.files)
    differ = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    for key in differ:
        print(f"differs: {key}")
    print(f"{len(before) - len(differ)} of {len(before)} identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
