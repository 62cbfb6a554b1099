"""Pure-Python twins of the C kernel, slow and plain on purpose; differential tests hold the C to them."""
