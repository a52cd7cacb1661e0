"""Tests of npddp.util."""
