"""Specs: validated descriptions of what is simulated — model, quantization, machine, runtime, placement,
llama.cpp tensor overrides and routing profile. This layer reads the catalog and imports nothing above it."""
