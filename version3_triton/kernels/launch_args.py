"""What a launch plan (common.py) puts in place of a recorded launch's arguments (`slots`),
and what a replay hands the kernel there: a named tensor's address; a view's, which is a named
tensor's address plus the view's fixed offset; a TMA descriptor's tensor map.

A view's offset is fixed when the launcher makes the view from a named tensor and values the
plan key holds (the head a gradient slot starts at, say), as attention's launchers do.

A TMA descriptor (attention_hopper.py's kernels take them) reaches the GPU as a tensor map:
128 bytes that encode a tile's address, shape, strides and swizzle, which the CUDA driver
builds on the host (cuTensorMapEncodeTiled) and the launch copies into the kernel's
parameters. Triton 3.6's launcher builds one for every descriptor on every launch, behind a
Python wrapper, from a Gluon TensorDescriptor the caller built: fifteen maps and eleven
descriptors in a forward + backward. `MapLaunch` calls the C launch under that wrapper itself,
with each map encoded by Triton's own function once per address, shape and strides. A plan
goes one step further: it calls the C launch itself, its template already holding the shape
and strides that follow each map (fixed for the plan), and a descriptor's slot looks its map
up by this call's address alone (`Maps`). A plan holds no tensor alive, and a replay builds
no descriptor and no key: a TMA slot costs what an address slot costs."""
from __future__ import annotations

import inspect
from typing import Optional

import torch

_MAX_MAPS = 1024  # tensor maps kept per kernel; forgotten all at once past this many


def slots(args, where: dict, launcher) -> Optional[tuple]:
    """(what to call, template, slots) of a launch recorded with `launcher`: args with each
    tensor replaced by a slot (position, named tensor, byte offset, None: its address goes
    there) and each TMA descriptor by a slot whose last field is its `Maps` (its tensor map
    goes there; the template holds the shape and strides after it, and what to call is the C
    launch under the MapLaunch). where: id(named tensor) -> its place. None if an argument
    cannot be replayed: a tensor neither named nor a view of one, or not 16-byte aligned
    (Triton compiled the kernel for that), or a descriptor where the launcher is not a
    MapLaunch (only it says how a map is encoded)."""
    template, found = [], []
    mapped = isinstance(launcher, MapLaunch)
    for position, arg in enumerate(args):
        maps = None
        if isinstance(arg, torch.Tensor):
            tensor = arg
        elif hasattr(arg, "block_shape"):  # a TMA descriptor
            if not mapped or position not in launcher.metas:
                return None
            tensor, maps = arg.base, Maps(launcher, _described(arg), position)
        else:
            template.append(arg)
            continue
        source = _source(tensor, where)
        if source is None or tensor.data_ptr() & 15:
            return None
        found.append((len(template), *source, maps))
        if maps is None:
            template.append(None)  # the plan holds no tensor alive
        else:  # [map, *shape, *strides]: the shape and strides are the plan's for good
            template += [None, *launcher._map(arg, position)[1:]]
    if mapped:
        if len(args) <= max(launcher.metas) or not all(
                hasattr(args[p], "block_shape") for p in launcher.metas):
            return None  # a map the C launch expects that this launch did not describe
        launcher = launcher.c_launch
    return launcher, template, tuple(found)


def _described(descriptor) -> tuple:
    """(shape, strides, padding): what a tensor map encodes of a descriptor besides its
    address - the plan's slot and MapLaunch's key alike, so a replay finds the map the
    first, bound launch encoded."""
    return tuple(descriptor.shape), tuple(descriptor.strides), descriptor.padding


def _source(t: torch.Tensor, where: dict) -> Optional[tuple[int, int]]:
    """(place of the named tensor t is or views, byte offset of t in it), or None."""
    if id(t) in where:
        return where[id(t)], 0
    base = t._base  # a view the launcher made of a named tensor
    if base is not None and id(base) in where:
        return where[id(base)], t.data_ptr() - base.data_ptr()
    return None


def map_launch(launch):
    """Triton's launch of a compiled kernel, as MapLaunch where it is Triton 3.6's wrapper that
    builds the tensor maps (anything else as it is: a plan then records no descriptor)."""
    try:
        source = " ".join(inspect.getsource(launch).split())
        cells = {name: cell.cell_contents
                 for name, cell in zip(launch.__code__.co_freevars, launch.__closure__)}
        metas, positions = cells["tensordesc_meta"], sorted(cells["tensordesc_indices"])
        encode = launch.__globals__["make_tensordesc_arg"]
        base = launch.__globals__["_BASE_ARGS_FORMAT_LEN"]
        c_launch = cells["launcher"]
    except (OSError, TypeError, AttributeError, KeyError):
        return launch
    known = ("make_tensordesc_arg(arg, tensordesc_meta[tensordesc_idx])" in source
             and "return launcher(*final_args)" in source)
    if not known or not metas or None in metas or len(metas) != len(positions):
        return launch
    return MapLaunch(c_launch, encode, base, dict(zip(positions, metas)))


class MapLaunch:
    """A kernel's C launch, each TMA descriptor's tensor map encoded once (see the top)."""

    def __init__(self, c_launch, encode, base: int, metas: dict):
        self.c_launch, self.encode, self.base = c_launch, encode, base
        self.metas = metas  # the kernel argument's position -> how Triton encodes its map
        self.maps: dict[tuple, list] = {}

    def __call__(self, *args):
        call = list(args)
        for position in reversed(self.metas):  # from the last: earlier positions stay put
            at = self.base + position
            call[at:at + 1] = self._map(call[at], position)
        return self.c_launch(*call)

    def _map(self, arg, position: int) -> list:
        """[tensor map, *shape, *strides]: the arguments Triton's C launch takes for a
        descriptor, given as a TensorDescriptor or as (address, shape, strides, padding)."""
        if arg.__class__ is tuple:
            key = (*arg, position)
        else:
            key = (arg.base.data_ptr(), *_described(arg), position)
        got = self.maps.get(key)
        if got is None:
            if len(self.maps) >= _MAX_MAPS:
                self.maps.clear()
            got = self.maps[key] = self.encode(_Described(*key[:4]), self.metas[position])
        return got


class Maps(dict):
    """One descriptor slot of a plan: this call's address -> its tensor map, encoded by the
    MapLaunch on the first call at an address (a dict lookup after that)."""

    def __init__(self, launcher: MapLaunch, described: tuple, position: int):
        super().__init__()
        self.launcher, self.described, self.position = launcher, described, position

    def __missing__(self, address: int):
        if len(self) >= _MAX_MAPS:
            self.clear()
        got = self[address] = self.launcher._map((address, *self.described), self.position)[0]
        return got


class _Described:
    """What Triton's make_tensordesc_arg reads of a descriptor; its base is itself."""
    __slots__ = ("address", "shape", "strides", "padding")

    def __init__(self, address: int, shape: tuple, strides: tuple, padding: str):
        self.address, self.shape, self.strides, self.padding = address, shape, strides, padding

    @property
    def base(self):
        return self

    def data_ptr(self) -> int:
        return self.address
