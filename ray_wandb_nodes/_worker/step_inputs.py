"""Time waiting for input: ``next()`` on the iterators training reads from, with no user code.

- torch: every ``DataLoader``'s iterator (``_BaseDataLoaderIter.__next__``, which both the
  single-process and the worker-process iterators inherit; torch 1.x to 2.13). That covers the
  loaders of Ray's ``prepare_data_loader`` (its wrapper prefetches from the torch iterator it
  holds: the fetch is timed, the host-to-device copy is not), Accelerate's and so the Hugging Face
  ``Trainer``'s, and Lightning's.
- Ray Data: the iterables ``DataIterator.iter_batches`` and ``iter_torch_batches`` return (Ray
  2.50 to 2.60; ``get_dataset_shard`` hands a ``DataIterator``), each ``next()`` on them.

A fetch inside another timed fetch (a loader over a Ray Data iterable) is timed once, by the
outer one; a fetch on another thread than the one that steps the optimizer (a prefetching thread
of the user's) is not the training thread's wait, and is not timed. The patches are classes'
methods, made once the module is imported (``_on_import``); in a process that is not armed they
call the original and nothing else.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .._steps.recorder import StepRecorder

MARK = "_ray_wandb_nodes_input"


class Current:
    """The process's recorder, where the hooks find it; None: not armed (the hooks pass through)."""

    __slots__ = ("recorder",)

    def __init__(self) -> None:
        self.recorder: StepRecorder | None = None


def timed_fetch(current: Current, fetch: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``fetch(iterator)`` (an iterator's ``__next__``) with its time added to the recorder's input."""

    ident = threading.get_ident

    @functools.wraps(fetch)
    def timed_next(self: Any) -> Any:
        rec = current.recorder
        if rec is None or rec.inside or (rec.thread and rec.thread != ident()):
            return fetch(self)
        now = rec.now
        rec.inside = True
        start = now()
        if rec.open >= 0:  # a pass's busy span ends where the next batch is fetched
            rec.close_pass(start)
        try:
            item = fetch(self)
        except BaseException:  # StopIteration at an epoch's end included: its wait is input too
            rec.input_ns += now() - start
            rec.inside = False
            raise
        rec.input_ns += now() - start
        rec.batches += 1
        rec.inside = False
        return item

    setattr(timed_next, MARK, True)
    return timed_next


@dataclass(frozen=True)
class TimeDataLoaders:
    """The patch on ``torch.utils.data.dataloader``: every DataLoader iterator's ``next()`` timed."""

    current: Current

    def __call__(self, module: ModuleType) -> None:
        cls = getattr(module, "_BaseDataLoaderIter", None)
        fetch = getattr(cls, "__next__", None)
        if cls is None or fetch is None or getattr(fetch, MARK, False):
            return  # a release without it: its loaders are not timed
        cls.__next__ = timed_fetch(self.current, fetch)


class TimedIterable:
    """An iterable whose iterators' ``next()`` is timed (what Ray Data's batch iterables become);
    any other attribute is the wrapped iterable's."""

    def __init__(self, inner: Iterable[Any], current: Current) -> None:
        self._inner = inner
        self._current = current

    def __iter__(self) -> Iterator[Any]:
        return TimedIterator(iter(self._inner), self._current)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TimedIterator:
    def __init__(self, inner: Iterator[Any], current: Current) -> None:
        self._inner = inner
        self._fetch = timed_fetch(current, _next_of)

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        return self._fetch(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _next_of(iterator: Iterator[Any]) -> Any:
    return next(iterator)


@dataclass(frozen=True)
class TimeRayData:
    """The patch on ``ray.data.iterator`` (``cls_name`` ``DataIterator``: what
    ``ray.train.get_dataset_shard`` returns) or ``ray.data.dataset`` (``Dataset``): what their
    ``iter_batches`` and ``iter_torch_batches`` return is a :class:`TimedIterable`. Both: a
    ``Dataset``'s may go round the iterator's public methods (Ray 2.60's ``iter_batches`` calls
    its iterator's private one); where one calls the other, a fetch inside a fetch is timed once."""

    current: Current
    cls_name: str = "DataIterator"
    methods: tuple[str, ...] = ("iter_batches", "iter_torch_batches")

    def __call__(self, module: ModuleType) -> None:
        cls = getattr(module, self.cls_name, None)
        if not isinstance(cls, type):
            return
        for name in self.methods:
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, MARK, False):
                setattr(cls, name, self._timed(method))

    def _timed(self, method: Callable[..., Iterable[Any]]) -> Callable[..., Iterable[Any]]:
        current = self.current

        @functools.wraps(method)
        def batches(*args: Any, **kwargs: Any) -> Iterable[Any]:
            iterable = method(*args, **kwargs)
            return iterable if current.recorder is None else TimedIterable(iterable, current)

        setattr(batches, MARK, True)
        return batches
