"""Tests of npddp.parallel."""
