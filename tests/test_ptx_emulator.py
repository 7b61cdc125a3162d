# SPDX-License-Identifier: BSD-3-Clause
"""The PTX emulator's race rules (tests/ptx_emulator.py), on hand-written kernels: the kernel
tests rely on them to see a missing bar.sync, which lockstep emulation cannot show as a wrong
value. One thread of CTA 0 stores a word; then a reader loads it, with or without a bar.sync
between."""

from __future__ import annotations

import numpy as np
import pytest
from ptx_emulator import GlobalMemory, Grid, Params, PtxError, parse_ptx

# (WRITER: the thread that stores; BARRIER: "bar.sync 0;" or nothing; READER: a predicate on
# %r1 = tid.x and %r2 = ctaid.x that selects the threads that load)
_KERNEL = """
.visible .entry probe(
    .param .u64 probe_param_0
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<5>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [probe_param_0];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    or.b32 %r3, %r1, %r2;
    setp.ne.s32 %p1, %r3, WRITER;
    @%p1 bra $L__stored;
    st.global.b32 [%rd1], %r1;
$L__stored:
    BARRIER
    READER
    @%p2 bra $L__done;
    ld.global.b32 %r4, [%rd1];
$L__done:
    ret;
}
"""
# the threads that load (%p2 set: skip the load): every thread of CTA 0, the writer alone
# (thread 0 of CTA 0), every thread of CTA 1
READERS = {
    "its CTA": "setp.ne.s32 %p2, %r2, 0;",
    "itself": "setp.ne.s32 %p2, %r3, 0;",
    "another CTA": "setp.eq.s32 %p2, %r2, 0;",
}


def _run(writer, barrier: bool, reader: str) -> None:
    """Two CTAs of 64 threads; ``writer``: 0 (thread 0 of CTA 0 stores) or "%r3" (all do)."""
    ptx = _KERNEL.replace("WRITER", str(writer)).replace("READER", READERS[reader])
    ptx = ptx.replace("BARRIER", "bar.sync 0;" if barrier else "")
    (entry,) = parse_ptx(ptx).values()
    gmem = GlobalMemory()
    params = Params(entry)
    params.put(0, gmem.alloc(np.zeros(4, np.uint8).tobytes()), 8)
    Grid(entry, 2, 64, params, gmem).run()


def test_a_load_after_another_threads_store_needs_a_bar_sync():
    with pytest.raises(PtxError, match="global race: no bar.sync"):
        _run(0, barrier=False, reader="its CTA")
    _run(0, barrier=True, reader="its CTA")


def test_a_bar_sync_does_not_order_another_ctas_store():
    with pytest.raises(PtxError, match="global race: no bar.sync"):
        _run(0, barrier=True, reader="another CTA")


def test_a_thread_reads_its_own_store_without_a_bar_sync():
    _run(0, barrier=False, reader="itself")


def test_two_threads_storing_one_word_at_once_race():
    # (every thread of both CTAs stores: the writer predicate never skips)
    with pytest.raises(PtxError, match="global race: threads store the same bytes at once"):
        _run("%r3", barrier=True, reader="itself")
