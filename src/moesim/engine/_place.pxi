# Glue of csrc/ms_place.c (included at the end of _kernel.pyx): the automatic placement of one configuration
# and the largest context that fits under it.


def auto_placement(SweepMemory mem, int64_t context, int64_t batch):
    """(code, index into the group's candidates) of the placement ms_sweep_choose picks at (context, batch)."""
    cdef int32_t chosen = -1
    cdef int code
    with nogil:
        code = ms_auto_placement(&mem.g, context, batch, &chosen)
    return code, chosen


def auto_max_context(SweepMemory mem, int64_t batch):
    """(code, largest context that fits at *batch* under the placement ms_sweep_choose picks for it)."""
    cdef int64_t out = 0
    cdef int code
    with nogil:
        code = ms_auto_max_context(&mem.g, batch, &out)
    return code, out
