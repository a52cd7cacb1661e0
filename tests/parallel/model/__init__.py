"""Tests of npddp.parallel.model composed with data parallelism."""
