"""Communicators that run one algorithm over a transport: every collective by point-to-point messages."""
