"""Tied parameters in plain-file checkpoints, and in parameter counts.

safetensors refuses tensors that share memory, and the released Caduceus/Mamba checkpoints
store each tied tensor once. A module with tied parameters calls `store_tied_once(self)`:
its `state_dict()` then holds each shared tensor under its first name only, and
`load_state_dict` accepts a state with any one name of each tied group (the others are
filled in from it before the strict key check).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def tied_groups(module: nn.Module) -> list[list[str]]:
    """Names of each parameter that is registered under more than one name, first name first."""
    names: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def _drop_aliases(module: nn.Module, state_dict: dict, prefix: str, local_metadata) -> None:
    for group in tied_groups(module):
        for alias in group[1:]:
            state_dict.pop(prefix + alias, None)


def _fill_aliases(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    for group in tied_groups(module):
        present = [name for name in group if prefix + name in state_dict]
        if present:
            for name in group:
                state_dict.setdefault(prefix + name, state_dict[prefix + present[0]])


def count_parameters(module: nn.Module, excluded: Sequence[nn.Parameter] = ()) -> int:
    """The parameters of `module`, a tied one counted once, less the `excluded` tensors (the
    embedding tables, for `num_parameters(non_embedding=True)`)."""
    total = sum(p.numel() for p in module.parameters())
    return total - sum(p.numel() for p in excluded)


def store_tied_once(module: nn.Module) -> None:
    module.register_state_dict_post_hook(_drop_aliases)
    module.register_load_state_dict_pre_hook(_fill_aliases)


def canonical_state(module: nn.Module, weights: dict, source: str = "") -> dict:
    """`weights` with each tied group under the name `module.state_dict()` uses (its first),
    taken from whichever name of the group the file stores (a released checkpoint may keep
    another)."""
    from ..errors import MdlmError

    weights = dict(weights)
    for group in tied_groups(module):
        present = [name for name in group if name in weights]
        if not present:
            continue
        value = weights[present[0]]
        for name in present[1:]:
            if weights[name].shape != value.shape or not bool((weights[name] == value).all()):
                raise MdlmError(
                    f"{source}: {name} should be tied to {present[0]} but holds other values"
                )
            del weights[name]
        if present[0] != group[0]:
            weights[group[0]] = weights.pop(present[0])
    return weights
