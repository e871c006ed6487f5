"""Derived values of a frozen Plan, computed once (:class:`derived`), and frozen instances
made faster (:func:`made`)."""

from __future__ import annotations


class derived:
    """A property computed on first use and kept in the instance's ``__dict__`` (a frozen
    dataclass's fields never change, so neither does a value derived from them alone); like
    :class:`functools.cached_property`, without its lock. Equality, hashing, ``replace`` and
    ``asdict`` see only the fields."""

    def __init__(self, func):
        self.func, self.name, self.__doc__ = func, func.__name__, func.__doc__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.func(obj)
        return value


def made(cls: type, fields: dict):
    """The instance of frozen dataclass ``cls`` whose fields are ``fields`` (every one of
    them), made without running ``__init__``, which does nothing but set them (``cls`` has no
    ``__post_init__``): equal, hashed and printed as ``cls(**fields)``, and faster."""
    obj = object.__new__(cls)
    object.__setattr__(obj, "__dict__", fields)
    return obj
