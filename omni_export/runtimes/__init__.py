"""Runtimes: an artifact file -> a callable over named numpy inputs. A runtime that cannot run here raises
``RuntimeUnavailable`` (the artifact is then ``unverified``); it never pretends."""
import functools


class RuntimeUnavailable(Exception):
    pass


def lazy(factory):
    """A runner that makes its session (``factory()``) at its first call, not before: a chain of parts whose
    calls never reach a part never holds that part's weights."""
    make = functools.cache(factory)
    return lambda feed: make()(feed)
