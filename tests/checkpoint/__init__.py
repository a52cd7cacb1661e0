"""Tests of npddp.checkpoint."""
