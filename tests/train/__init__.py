"""Tests of npddp.train."""
