#include "moesim.h"

/* One table for every code the core returns (tskit style). */
const char *ms_strerror(int err)
{
    switch (err) {
    case 0: return "no error";
    case MS_ERR_NULL_ARGUMENT: return "a required pointer argument was NULL";
    case MS_ERR_BAD_SIZE: return "a size (layers, batch, GPUs or experts) was out of range";
    case MS_ERR_BAD_PLACEMENT: return "unknown placement or placement argument out of range";
    case MS_ERR_BAD_CONTEXT: return "context must be at least 1 token";
    case MS_ERR_BAD_CAPACITY: return "a capacity or bytes-per-element value was negative or not finite";
    case MS_ERR_NO_MEMORY: return "out of memory";
    case MS_ERR_BAD_ROUTING: return "routing profile out of range (experts, top-k, groups or probabilities)";
    case MS_ERR_BAD_POLICY: return "unknown cache policy, or a policy the analytic path cannot evaluate";
    case MS_ERR_BAD_TRACE: return "trace expert id out of range or trace too short";
    case MS_ERR_BAD_WORKSPACE: return "workspace smaller than ms_decode_workspace_size()";
    case MS_ERR_BAD_MACHINE: return "a bandwidth or FLOP rate was not positive";
    case MS_ERR_BAD_SWEEP: return "sweep tables inconsistent (placement, variant or kind index out of range)";
    case MS_ERR_BAD_SERVE: return "serving workload or step table out of range (sizes, grids, rate or steps)";
    case MS_ERR_KV_TOO_SMALL: return "the KV cache cannot hold one request's first prompt chunk";
    default: return "unknown moesim error";
    }
}
