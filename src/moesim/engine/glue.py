"""The one place a C return code becomes a Python exception (tskit's ``handle_library_error``).

Validation happens before the kernel runs, so a non-zero code means moesim itself let bad tables
through: it raises :class:`~moesim.errors.KernelError` naming the entry point, the configuration
and the message of ``ms_strerror``.
"""
from __future__ import annotations

from ..errors import KernelError


def handle_library_error(code: int, where: str, index: int | None = None) -> None:
    """Raise KernelError for a non-zero *code* returned by the C entry point *where*; else return."""
    if not code:
        return
    from . import _kernel
    at = f" at configuration {index}" if index is not None and index >= 0 else ""
    raise KernelError(f"{where}: C kernel error{at}: {_kernel.strerror(int(code))} (code {int(code)})")
