# Prefill: ms_prefill_model_t built once per lowered model (PrefillModel), ms_prefill_machine_t once per machine
# (PrefillMachine), and ms_prefill_seconds of the pair; included by _kernel.pyx.


cdef class PrefillModel:
    """C view of prefill's machine-independent terms (engine.prefill packs them; glue.PREFILL_MODEL declares
    them), checked once: every machine that runs this lowered model reuses it."""
    cdef ms_prefill_model_t p
    cdef object keep

    def __init__(self, dict t):
        keep = {}
        c = check_struct("ms_prefill_model_t", t)
        self.p.n_layers = <int32_t> c["on_gpu"].shape[0]
        self.p.on_gpu = <int32_t *> _data(keep, "on_gpu", c["on_gpu"])
        self.p.weights = <double *> _data(keep, "weights", c["weights"])
        self.p.flops = <double *> _data(keep, "flops", c["flops"])
        self.p.score_flops = <double *> _data(keep, "score_flops", c["score_flops"])
        self.p.decompress_flops = <double *> _data(keep, "decompress_flops", c["decompress_flops"])
        self.p.act = <double *> _data(keep, "act", c["act"])
        self.p.kv_one = <double *> _data(keep, "kv_one", c["kv_one"])
        self.p.kv_heads = <double *> _data(keep, "kv_heads", c["kv_heads"])
        self.p.n_sizes = <int32_t> c["sizes"].shape[0]
        self.p.sizes = <int64_t *> _data(keep, "sizes", c["sizes"])
        self.p.size_rows = <double *> _data(keep, "size_rows", c["size_rows"])
        self.p.size_tiled = <int32_t *> _data(keep, "size_tiled", c["size_tiled"])
        self.p.n_exp = <int32_t> c["exp_layer"].shape[0]
        self.p.exp_layer = <int32_t *> _data(keep, "exp_layer", c["exp_layer"])
        self.p.exp_mode = <int32_t *> _data(keep, "exp_mode", c["exp_mode"])
        self.p.exp_share = <double *> _data(keep, "exp_share", c["exp_share"])
        self.p.exp_bytes = <double *> _data(keep, "exp_bytes", c["exp_bytes"])
        self.p.exp_flops = <double *> _data(keep, "exp_flops", c["exp_flops"])
        self.p.exp_layer_experts = <double *> _data(keep, "exp_layer_experts", c["exp_layer_experts"])
        self.p.exp_distinct = <double *> _data(keep, "exp_distinct", c["exp_distinct"])
        self.p.top_k = c["top_k"]
        self.p.threshold = c["threshold"]
        self.p.offload = c["offload"]
        self.p.head_bytes = c["head_bytes"]
        self.p.head_flops = c["head_flops"]
        self.p.amx_per_cycle = c["amx_per_cycle"]
        self.keep = keep


cdef class PrefillMachine:
    """C view of the machine rates prefill reads (glue.PREFILL_MACHINE), checked once per machine."""
    cdef ms_prefill_machine_t h

    def __init__(self, t):
        c = check_struct("ms_prefill_machine_t", t)
        self.h.gpu_bw = c["gpu_bw"]; self.h.host_bw = c["host_bw"]; self.h.pcie_bw = c["pcie_bw"]
        self.h.pcie_links = c["pcie_links"]; self.h.prefill_flops = c["prefill_flops"]
        self.h.prefill_gemm_flops = c["prefill_gemm_flops"]; self.h.prefill_expert_flops = c["prefill_expert_flops"]
        self.h.cpu_flops = c["cpu_flops"]; self.h.prefill_attn_flops = c["prefill_attn_flops"]
        self.h.cpu_prefill_attn_flops = c["cpu_prefill_attn_flops"]; self.h.launch_s = c["launch_s"]
        self.h.cpu_layer_s = c["cpu_layer_s"]; self.h.sync_s = c["sync_s"]; self.h.cpu_llc_bytes = c["cpu_llc_bytes"]
        self.h.prefill_moe_half_tokens = c["prefill_moe_half_tokens"]; self.h.amx_flops = c["amx_flops"]
        self.h.prefill_weight_pass_tokens = c["prefill_weight_pass_tokens"]
        self.h.prefill_moe_tile_tokens = c["prefill_moe_tile_tokens"]; self.h.step_s = c["step_s"]
        self.h.overlap = c["overlap"]; self.h.gpu_moe_rowwise = c["gpu_moe_rowwise"]


def prefill_seconds(PrefillModel p, PrefillMachine h):
    """(code, seconds): ms_prefill_seconds of one lowered model's terms on one machine."""
    cdef double stack[256]
    cdef double *ws = stack
    cdef double out = 0.0
    cdef int code
    if p.p.n_layers > 256:          # the per-layer times of a deeper model live on the heap
        ws = <double *> malloc(p.p.n_layers * sizeof(double))
        if ws == NULL:
            raise MemoryError()
    try:
        with nogil:
            code = ms_prefill_seconds(&p.p, &h.h, ws, &out)
    finally:
        if ws != stack:
            free(ws)
    return code, out


def prefill_many(list models, list machines):
    """(code, index of the failing pair or -1, seconds): prefill_seconds of each (models[i], machines[i]) pair, one
    call for a sweep group's (lowered model, machine) pairs; the same C call per pair."""
    cdef Py_ssize_t n = len(models), i, most = 0
    cdef PrefillModel p
    cdef PrefillMachine h
    cdef double stack[256]
    cdef double *ws = stack
    cdef double out = 0.0
    cdef int code = 0
    if len(machines) != n:
        raise ValueError("prefill_many: as many machines as models")
    for i in range(n):
        p = models[i]
        most = max(most, p.p.n_layers)
    secs = [0.0] * n
    if most > 256:                  # the per-layer times of a deeper model live on the heap
        ws = <double *> malloc(most * sizeof(double))
        if ws == NULL:
            raise MemoryError()
    try:
        for i in range(n):
            p = models[i]
            h = machines[i]
            with nogil:
                code = ms_prefill_seconds(&p.p, &h.h, ws, &out)
            if code:
                return code, i, None
            secs[i] = out
    finally:
        if ws != stack:
            free(ws)
    return 0, -1, secs
