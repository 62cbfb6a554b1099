"""Lowering: specs to the plain arrays and scalars of the kernel's structs, one module per struct."""
