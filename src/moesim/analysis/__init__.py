"""Analyses built on the engine: resolving a configuration, fit, simulate, sweeps, validation and calibration."""
