"""Benchmark faces of npddp: collective sweeps, DDP breakdowns and the report that reads their dumps."""
