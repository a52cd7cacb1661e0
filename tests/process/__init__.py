"""Tests of npddp.process."""
