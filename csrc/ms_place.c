/*
 * Automatic placement of one configuration: the placement the runtime's own fitting picks (llama.cpp
 * --fit: everything on the GPU, else the fewest layers' routed experts in host RAM, else fewer whole
 * layers, then CPU only; ktransformers: as many experts per layer on the GPU as fit).
 *
 * The rule itself is ms_sweep_choose (ms_sweep.c), written once for sweeps and fit alike; this file
 * only checks the inputs and runs it for a single (context, batch) with an empty cache and no hint, and
 * gives the largest context that fits under it (ms_sweep_auto_max_context, as sweeps report it).
 * Its Python twin is engine/reference/sweep.py choose().
 */
#include <stddef.h>

#include "moesim.h"
#include "ms_internal.h"

int ms_auto_placement(const ms_sweep_mem_t *g, int64_t context, int64_t batch, int32_t *chosen)
{
    kvpart_t k = {-1, -1, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    int64_t hint = -1;
    int rc;
    if (chosen == NULL) return MS_ERR_NULL_ARGUMENT;
    rc = ms_sweep_check_mem(g);
    if (rc != 0) return rc;
    if (context < 1) return MS_ERR_BAD_CONTEXT;
    if (batch < 1) return MS_ERR_BAD_SIZE;
    *chosen = g->rule == MS_SWEEP_FIXED ? 0 : ms_sweep_choose(g, context, batch, -1, &k, &hint);
    return 0;
}

int ms_auto_max_context(const ms_sweep_mem_t *g, int64_t batch, int64_t *max_context)
{
    int rc;
    if (max_context == NULL) return MS_ERR_NULL_ARGUMENT;
    rc = ms_sweep_check_mem(g);
    if (rc != 0) return rc;
    if (batch < 1) return MS_ERR_BAD_SIZE;
    *max_context = ms_sweep_auto_max_context(g, batch);
    return 0;
}
