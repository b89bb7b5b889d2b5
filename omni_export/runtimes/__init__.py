"""Runtimes: an artifact file -> a callable over named numpy inputs. A runtime that cannot run here raises
``RuntimeUnavailable`` (the artifact is then ``unverified``); it never pretends."""


class RuntimeUnavailable(Exception):
    pass
