"""The one error family moesim raises for bad input, and the C error-code table's Python side."""
from __future__ import annotations

import difflib
from typing import Iterable


class MoesimError(ValueError):
    """Bad input to moesim: names the offending field and, where it can, what would be valid.

    Attributes
    ----------
    field : str or None
        The parameter, flag or catalog field that is wrong (e.g. ``"quant"``, ``"--context"``).
    """

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)

    def __reduce__(self):
        # the message already names the field: unpickling must not run __init__ (it would prefix it again);
        # a sweep's forked worker sends its errors to the parent pickled
        return (_rebuilt, (type(self), self.args, self.__dict__))


def _rebuilt(cls, args: tuple, state: dict):
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class KernelError(RuntimeError):
    """The C kernel returned an error code that validation should have prevented (a moesim bug)."""


def unknown_id(kind: str, value: str, known: Iterable[str], field: str) -> MoesimError:
    """A MoesimError for an unknown catalog id, suggesting the nearest known ids."""
    known = sorted(known)
    close = difflib.get_close_matches(str(value).lower(), [k.lower() for k in known], n=3, cutoff=0.5)
    lower_to_id = {k.lower(): k for k in known}
    hint = ""
    if close:
        hint = "; did you mean " + ", ".join(repr(lower_to_id[c]) for c in close) + "?"
    elif len(known) <= 40:
        hint = "; known: " + ", ".join(known)
    return MoesimError(f"unknown {kind} {value!r}{hint}", field)
