"""The engine: lowering specs to the C kernel's structs (``lower/``), the kernel glue (``_kernel``), the
enum mirror of ``csrc/moesim.h`` (``codes``), the prefill model, and the pure-Python twins (``reference/``)."""
