# SPDX-License-Identifier: BSD-3-Clause
"""``FP4Buffers``: the base of the modules that hold FP4 parts as buffers (``FP4Linear``,
``FP4MoE``)."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from fp4_ops.tensor import picklable, unpickled


class FP4Buffers(nn.Module):
    """Base of modules that hold FP4 parts as buffers (``kept_buffers``): ``.to(dtype)``,
    ``.half()`` and the like keep those buffers' dtypes while every move takes them along;
    pickle, ``copy.deepcopy`` and ``torch.save`` carry float8 scales as their bytes. The
    attributes named in ``CACHES`` (values derived from the buffers) are dropped by both."""

    CACHES: tuple[str, ...] = ()

    def kept_buffers(self) -> dict[str, torch.Tensor]:
        """The buffers whose dtype no cast may change, by name."""
        raise NotImplementedError

    def _apply(self, fn, recurse=True):
        # nn.Module.to / half / bfloat16 / float / cuda / cpu all come here: fn casts every
        # floating-point tensor, float8 scales and float32 global scales included
        before = self.kept_buffers()
        for name in self.CACHES:
            setattr(self, name, None)
        super()._apply(fn, recurse)
        for name, old in before.items():
            new = self._buffers[name]
            if new.dtype != old.dtype:
                self._buffers[name] = old.to(new.device)
        return self

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors
    ):
        # (nn.Module's own runs the load pre-hooks first, then loads: so do these modules)
        for hook in self._load_state_dict_pre_hooks.values():
            hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors)
        self._load_fp4_state(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys
        )

    def _load_into(self, name: str, value: torch.Tensor, key: str) -> None:
        """``load_state_dict``'s copy of ``value`` into the buffer or parameter ``name`` (its
        checkpoint ``key``): a meta tensor cannot take values, and, as torch's own load says,
        copying into one is a no-op that only ``assign=True`` avoids."""
        target = getattr(self, name)
        if target.is_meta and not value.is_meta:
            warnings.warn(
                f"for {key}: copying from a non-meta tensor in the checkpoint to a meta tensor "
                "in the current model is a no-op (pass assign=True to load_state_dict to assign "
                "the checkpoint's tensors)",
                UserWarning,
                stacklevel=4,
            )
            return
        target.copy_(value)

    def _load_fp4_state(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys
    ) -> None:
        """This module's part of ``load_state_dict``: every tensor checked (ValueError naming
        what differs) before any is assigned."""
        raise NotImplementedError

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_buffers"] = {n: picklable(t) for n, t in state["_buffers"].items()}
        state.update(dict.fromkeys(self.CACHES))
        return state

    def __setstate__(self, state: dict) -> None:
        # (a pickle made before a cache existed still gets it, empty)
        state = dict.fromkeys(self.CACHES) | dict(state)
        state["_buffers"] = {n: unpickled(v) for n, v in state["_buffers"].items()}
        super().__setstate__(state)
