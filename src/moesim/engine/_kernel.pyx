# cython: language_level=3
"""Thin glue between validated numpy arrays and the C core: check, convert, release the GIL, call, return.

Nothing else lives here. Every table is checked against its C struct's declared field table
(:mod:`moesim.engine.glue`) before C runs; validation of the values themselves happens in the Python
modules above. One extension module, its parts included per struct family:

- ``_kernel_rng.pxi``: the random streams (known-answer tests);
- ``_kernel_memory.pxi``: ms_model_t / ms_mem_config_t, ``memory_many``;
- ``_kernel_decode.pxi``: ms_decode_model_t / ms_machine_t / ms_decode_config_t, ``decode_many``;
- ``_kernel_routing.pxi``: ms_routing_t, ``q_tables``, ``route_sample``, ``cache_replay``;
- ``_kernel_sweep_memory.pxi`` / ``_kernel_sweep_decode.pxi``: the sweep groups and loops;
- ``_kernel_serve.pxi``: the serving scheduler ``serve``;
- ``_kernel_prefill.pxi``: ms_prefill_model_t / ms_prefill_machine_t, ``prefill_seconds``.
"""
import numpy as np
cimport numpy as cnp
from libc.stdlib cimport malloc, free
from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t
from libc.string cimport memset
from cython.parallel cimport prange, threadid

from moesim.errors import MoesimError
from moesim.engine.glue import StructError, check_che_columns, check_columns, check_routing, check_struct

cnp.import_array()


def strerror(int code):
    """The C core's message for an error code (one table, csrc/ms_error.c)."""
    return ms_strerror(code).decode("utf-8")


def openmp_enabled():
    """True when the extension was compiled with OpenMP (thread count > 1 is then honoured)."""
    return bool(_HAVE_OPENMP)


cdef extern from *:
    """
    #ifdef MOESIM_HAVE_OPENMP
    #define _HAVE_OPENMP 1
    #else
    #define _HAVE_OPENMP 0
    #endif
    """
    int _HAVE_OPENMP


cdef int _threads(int n_threads):
    """Threads a C loop may use: 1 without OpenMP."""
    return max(1, n_threads if _HAVE_OPENMP else 1)


cdef void *_data(dict keep, str name, arr):
    """Data pointer of a checked contiguous array (glue.check_struct), kept alive in `keep`; an empty
    array gets a one-element stand-in (C reads no element of it); None (an absent optional) is NULL."""
    if arr is None:
        return NULL
    if arr.size == 0:
        arr = np.zeros(1, dtype=arr.dtype)
    keep[name] = arr
    return cnp.PyArray_DATA(arr)


cdef void *_col(arr, char kind, int itemsize, Py_ssize_t n, bint writable, str name,
               Py_ssize_t offset=0) except NULL:
    """Pointer to element ``offset`` of a one-dimensional, C-contiguous, native-order ndarray of ``kind`` ('f', 'i')
    and ``itemsize`` with at least offset + n elements (n >= 1, offset >= 0), writable where asked (ValueError naming
    ``name`` otherwise): what a typed memoryview of its [offset:] slice points at, without building the slice or
    the view (a sweep group passes ~30 columns of a few rows)."""
    cdef cnp.ndarray a
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array, got {type(arr).__name__}")
    a = <cnp.ndarray> arr
    if (cnp.PyArray_NDIM(a) != 1 or cnp.PyArray_ITEMSIZE(a) != itemsize
            or not (cnp.PyArray_ISFLOAT(a) if kind == b'f' else cnp.PyArray_ISSIGNED(a))
            or not cnp.PyArray_IS_C_CONTIGUOUS(a) or not cnp.PyArray_ISNOTSWAPPED(a)):
        raise ValueError(f"{name}: expected a contiguous one-dimensional array of {chr(kind)}{itemsize}, got "
                         f"{arr.dtype} of shape {arr.shape}")
    if writable and not cnp.PyArray_ISWRITEABLE(a):
        raise ValueError(f"{name}: buffer source array is read-only")
    if n < 1 or offset < 0 or cnp.PyArray_DIM(a, 0) - offset < n:
        raise ValueError("output column shorter than the configurations")
    return (<char *> cnp.PyArray_DATA(a)) + offset * itemsize


include "_kernel_rng.pxi"
include "_kernel_memory.pxi"
include "_kernel_decode.pxi"
include "_kernel_routing.pxi"
include "_kernel_sweep_memory.pxi"
include "_kernel_sweep_decode.pxi"
include "_place.pxi"
include "_kernel_serve.pxi"
include "_kernel_prefill.pxi"
